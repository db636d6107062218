"""Training of the shipped sample models (``python -m studio.samples.train``) and helpers
that need the heavy libraries.

The registry of samples and data files is :mod:`studio.core.samples`.
"""

from __future__ import annotations

from studio.core.lazyimport import lazy_module
from studio.core.samples import sample_path

transformers = lazy_module("transformers")


def load_tokenizer(name: str):
    """The sample's tokenizer exactly as its ``tokenizer.json`` defines it.

    (``AutoTokenizer`` may rebuild a model family's own pre-tokenizer around the
    vocabulary; this loader never does.)
    """
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(sample_path(name)),
                                                                local_files_only=True)
