"""fairseq-generate, with token strings built from host lists instead of device tensors.

``python -m fairseq_gradinit.tools.host_generate ARGS`` runs ``fairseq_cli.generate`` with ARGS after
one change for this process only: ``Dictionary.string`` turns a one-dimensional tensor into a Python list
(one copy) before it looks up its tokens. fairseq-generate passes each sentence's source tokens to it as a
slice of the batch on the decoding device; iterating that tensor element by element costs several
device round trips per token (``.item()``, comparisons, indexing), and on the CPU too a 0-d tensor per
token costs far more host time than a list's int. The strings are the same.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence


def string_from_host_list(string):
    """Wrap ``Dictionary.string`` so that a 1-D tensor is read once as a list (same result)."""
    import torch

    def string_of_list(self, tensor, *args, **kwargs):
        if torch.is_tensor(tensor) and tensor.dim() == 1:
            tensor = tensor.tolist()
        return string(self, tensor, *args, **kwargs)

    string_of_list.host_list = True
    string_of_list.__doc__ = string.__doc__
    return string_of_list


def patch_dictionary_string() -> None:
    """Make ``fairseq.data.Dictionary.string`` read 1-D tensors as lists (once per process)."""
    from fairseq.data.dictionary import Dictionary

    if not getattr(Dictionary.string, "host_list", False):
        Dictionary.string = string_from_host_list(Dictionary.string)


def configure_logging() -> None:
    """fairseq-generate's own log format and level, set before fairseq is imported: importing fairseq runs a
    module's ``logging.basicConfig(level=logging.DEBUG)`` (its wav2vec2 classifier), which would otherwise win
    over fairseq-generate's and print hydra's debug lines in Python's default format."""
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> None:
    from ..command_line.quiet import hide_known_noise

    configure_logging()
    hide_known_noise()  # before fairseq's imports, which warn
    from fairseq_cli import generate

    # `python -m` imported this package before fairseq, so the plugin did not register itself, and fairseq's
    # --user-dir then finds the package loaded and imports nothing: register it now that fairseq is loaded.
    from .. import fairseq_plugin  # noqa: F401

    patch_dictionary_string()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    generate.cli_main()


if __name__ == "__main__":
    main()
