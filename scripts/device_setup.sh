#!/usr/bin/env bash
# Install fairseq and the plugin's other missing dependencies from carried wheels on the GPU machine
# (its image has torch, numpy, sacrebleu, sentencepiece and matplotlib, but no fairseq, and no
# package index can be reached from it).
#
#   here, once:  bash scripts/device_setup.sh --download .whl   # cp312 manylinux wheels into .whl/
#   there:       source scripts/device_setup.sh .whl /tmp/site   # installs, exports PYTHONPATH (wheels, checkout)
#   check here:  bash scripts/device_setup.sh --dry-run .whl     # lists what it would install, checks the set
#
# .whl/ must be ignored by git (echo /.whl/ >> .git/info/exclude) and named in the device call's carry.

DEVICE_SETUP_PACKAGES=("ve-fairseq==0.12.3" "hydra-core==1.3.2" "omegaconf==2.3.0" "bitarray")
# omegaconf 2.3 needs antlr4-python3-runtime 4.9.*, published as a source archive only: built
# here into a pure-Python wheel
DEVICE_SETUP_BUILT=("antlr4-python3-runtime==4.9.3")
# import names of the wheels above (ve-fairseq installs `fairseq` and `fairseq_cli`)
DEVICE_SETUP_NEEDED=(ve_fairseq hydra_core omegaconf bitarray antlr4_python3_runtime)

_device_setup_main() {
  local mode=install
  case "${1:-}" in
    --download) mode=download; shift ;;
    --dry-run) mode=dry; shift ;;
    -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}"; return 0 ;;
  esac
  local wheels=${1:?usage: device_setup.sh [--download|--dry-run] WHEEL_DIR [TARGET]} target=${2:-/tmp/site}
  local py=${PYTHON:-python3}
  if [ "$mode" = download ]; then
    mkdir -p "$wheels"
    local plat=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
             manylinux1_x86_64 manylinux_2_5_x86_64; do plat+=(--platform "$p"); done
    "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${plat[@]}" -d "$wheels" "${DEVICE_SETUP_PACKAGES[@]}"
    "$py" -m pip wheel --no-deps -w "$wheels" "${DEVICE_SETUP_BUILT[@]}"
    return 0
  fi
  shopt -s nullglob
  local files=("$wheels"/*.whl) missing=() name f found
  for name in "${DEVICE_SETUP_NEEDED[@]}"; do
    found=0
    for f in "${files[@]}"; do
      case "$(basename "$f" | tr 'A-Z-' 'a-z_')" in "${name}"_*) found=1 ;; esac
    done
    [ "$found" = 1 ] || missing+=("$name")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "device_setup: no wheel for ${missing[*]} in $wheels (run: bash scripts/device_setup.sh --download $wheels)" >&2
    return 1
  fi
  for f in "${files[@]}"; do
    case "$(basename "$f")" in
      *-cp3*-cp3*) case "$(basename "$f")" in *-cp312-*) ;; *) echo "device_setup: $f is not a cp312 wheel" >&2; return 1 ;; esac ;;
    esac
  done
  # the checkout's package, importable as `pip install -e .` makes it (scripts/*.py import it)
  local checkout
  checkout=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local cmd=("$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "${files[@]}")
  if [ "$mode" = dry ]; then
    echo "would run: ${cmd[*]}"
    echo "would export PYTHONPATH=$target:$checkout\${PYTHONPATH:+:\$PYTHONPATH}"
    return 0
  fi
  "${cmd[@]}"
  export PYTHONPATH="$target:$checkout${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c "import fairseq, fairseq_cli.train, hydra, omegaconf, bitarray, fairseq_gradinit; print('device_setup: fairseq', fairseq.__version__)"
}

_device_setup_main "$@"
