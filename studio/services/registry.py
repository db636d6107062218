"""The device registry for the front ends (the code lives in the engine, which the worker's
run stage reaches too)."""

from studio.engine.device_registry import AgentDevice, Registry, config_dir, parse_device_id

__all__ = ["AgentDevice", "Registry", "config_dir", "parse_device_id"]
