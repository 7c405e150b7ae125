"""Check that the installed torch, torchvision and torchaudio belong together.

``python -m fairseq_gradinit.install_check`` prints the versions, the torch build (CPU or CUDA) and one line
per mismatch; exit status 1 when torchvision does not match torch (it will not load), 0 otherwise. A torchaudio
of another release is only reported: fairseq requires torchaudio, but its text tasks (translation, language
modeling), which this package is tested with, never call it."""
from __future__ import annotations

import importlib.metadata
import re
import sys
from typing import Dict, List, Optional, Tuple

PACKAGES = ("torch", "torchvision", "torchaudio")


def release(version: Optional[str]) -> Optional[Tuple[int, int]]:
    """(major, minor) of a version string such as ``2.14.1+cpu``; ``None`` when absent or unreadable."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def installed_versions() -> Dict[str, Optional[str]]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def version_problems(versions: Dict[str, Optional[str]]) -> Tuple[List[str], List[str]]:
    """(errors, warnings) about the torch/torchvision/torchaudio versions in ``versions``.

    torch 2.m pairs with torchvision 0.(m+15) and torchaudio 2.m (the releases PyTorch publishes together)."""
    errors: List[str] = []
    warnings: List[str] = []
    torch = release(versions.get("torch"))
    if torch is None:
        return ["torch is not installed: install it first (see the README's install section)"], []
    vision, audio = release(versions.get("torchvision")), release(versions.get("torchaudio"))
    if vision is not None and torch[0] == 2 and vision != (0, torch[1] + 15):
        errors.append(f"torchvision {versions['torchvision']} does not belong to torch {versions['torch']} (it "
                      f"needs torchvision 0.{torch[1] + 15}): install the pair together, e.g. "
                      f"pip install torch=={versions['torch'].split('+')[0]} torchvision==0.{torch[1] + 15}.*")
    if audio is not None and audio != torch:
        warnings.append(f"torchaudio {versions['torchaudio']} was released for torch {audio[0]}.{audio[1]}, not "
                        f"{versions['torch']}: fairseq requires it, but its text tasks (translation, language "
                        "modeling) do not call it; speech tasks may fail. If PyPI offers torchaudio "
                        f"{torch[0]}.{torch[1]}, install that one.")
    return errors, warnings


def main(argv: Optional[List[str]] = None) -> int:
    versions = installed_versions()
    line = ", ".join(f"{k} {v or '-'}" for k, v in versions.items())
    try:
        import torch

        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
        line += f" (torch build: {build})"
    except ImportError:
        pass
    print(f"install check: {line}")
    errors, warnings = version_problems(versions)
    for text in warnings:
        print(f"install check: warning: {text}")
    for text in errors:
        print(f"install check: error: {text}")
    if not errors:
        print("install check: ok" + (" (with the warning above)" if warnings else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
