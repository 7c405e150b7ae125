#!/usr/bin/env bash
# Prepare IWSLT14 German->English for fairseq with a joint SentencePiece model.
#
# Same raw data and train/valid/test construction as fairseq's
# examples/translation/prepare-iwslt14.sh, but with a joint SentencePiece model trained on
# train de+en instead of Moses tokenization + BPE (and no lowercasing unless -l):
#   train : train.tags.de-en.{de,en} without the <url>/<talkid>/<keywords> lines and with the
#           <title>/<description> tags stripped, then cleaned like Moses clean-corpus-n.perl
#           (1..175 tokens per side, length ratio <= 1.5; here tokens = whitespace-separated
#           words of the untokenized text, fairseq counts Moses tokens);
#   valid : every 23rd line of the cleaned train data (removed from train);
#   test  : IWSLT14.TED.dev2010 + IWSLT14.TEDX.dev2012 + IWSLT14.TED.tst2010 + tst2011 + tst2012
#           (<seg> contents, U+2019 replaced by an ASCII apostrophe), concatenated in fairseq's
#           order.
# Then scripts/prepare_corpus.py trains the SentencePiece model, encodes the splits and runs
# fairseq-preprocess --joined-dictionary (with -s: one dictionary per side, the authors' setting).
#
# Usage: scripts/prepare_iwslt14.sh [-o OUT_DIR] [-v VOCAB_SIZE] [-w WORKERS] [-m MODEL_TYPE]
#                                   [-t LOCAL_TGZ] [-l] [-s] [-h]
#   -o OUT_DIR     output directory (env OUT_DIR; default <repo>/data-bin/iwslt14-de-en-spm)
#   -v VOCAB_SIZE  joint SentencePiece vocabulary size (env VOCAB_SIZE; default 10000)
#   -w WORKERS     threads/processes for SentencePiece and fairseq-preprocess (env WORKERS; 4)
#   -m MODEL_TYPE  SentencePiece model type: unigram or bpe (env SPM_MODEL_TYPE; unigram)
#   -t LOCAL_TGZ   use an already downloaded de-en.tgz instead of downloading (env IWSLT14_TGZ)
#   -l             lowercase all text, as fairseq's script does (env LOWERCASE=1)
#   -s             separate source/target dictionaries (env SEPARATE_DICTS=1): train with
#                  --share-decoder-input-output-embed, as the authors did, not --share-all-embeddings
# Other environment variables: PYTHON (interpreter with sentencepiece and fairseq; default
# python3), IWSLT14_URLS (space-separated download URLs, tried in order).
#
# Output: OUT_DIR/orig (archive + extracted XML), OUT_DIR/raw/{train,valid,test}.{de,en} (plain
# text), OUT_DIR/spm (SentencePiece model + encoded text), OUT_DIR/bin (fairseq data-bin: use it
# as DATA for fairseq-train/fairseq-generate, decode with --remove-bpe sentencepiece).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"

# The URL in fairseq's prepare-iwslt14.sh (the WIT3 archive at FBK). FBK has since moved its
# archive (the URL has answered 404 since about 2021); current fairseq downloads the same
# de-en.tgz from its own mirror, tried second.
DEFAULT_URLS="https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"

OUT_DIR="${OUT_DIR:-${REPO_ROOT}/data-bin/iwslt14-de-en-spm}"
VOCAB_SIZE="${VOCAB_SIZE:-10000}"
WORKERS="${WORKERS:-4}"
SPM_MODEL_TYPE="${SPM_MODEL_TYPE:-unigram}"
IWSLT14_TGZ="${IWSLT14_TGZ:-}"
LOWERCASE="${LOWERCASE:-0}"
SEPARATE_DICTS="${SEPARATE_DICTS:-0}"
PYTHON="${PYTHON:-python3}"
IWSLT14_URLS="${IWSLT14_URLS:-${DEFAULT_URLS}}"

usage() { sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }
die() { echo "ERROR: $*" >&2; exit 1; }
log() { echo "[prepare_iwslt14] $*" >&2; }

while getopts "o:v:w:m:t:lsh" opt; do
    case "${opt}" in
        o) OUT_DIR="${OPTARG}" ;;
        v) VOCAB_SIZE="${OPTARG}" ;;
        w) WORKERS="${OPTARG}" ;;
        m) SPM_MODEL_TYPE="${OPTARG}" ;;
        t) IWSLT14_TGZ="${OPTARG}" ;;
        l) LOWERCASE=1 ;;
        s) SEPARATE_DICTS=1 ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || die "unexpected arguments: $*"

[[ "${VOCAB_SIZE}" =~ ^[0-9]+$ ]] || die "vocab size must be a positive integer, got '${VOCAB_SIZE}'"
[[ "${WORKERS}" =~ ^[1-9][0-9]*$ ]] || die "workers must be a positive integer, got '${WORKERS}'"
case "${SPM_MODEL_TYPE}" in unigram|bpe) ;; *) die "model type must be unigram or bpe" ;; esac

command -v "${PYTHON}" >/dev/null 2>&1 || die "python interpreter '${PYTHON}' not found (set PYTHON=...)"
"${PYTHON}" -c "import sentencepiece" 2>/dev/null \
    || die "'${PYTHON}' cannot import sentencepiece (set PYTHON to the project's virtualenv python)"
"${PYTHON}" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('fairseq_cli') is None)" \
    || die "'${PYTHON}' cannot find fairseq (pip install ve-fairseq)"

src=de
tgt=en
lang=de-en
ORIG="${OUT_DIR}/orig"
RAW="${OUT_DIR}/raw"
TMP="${OUT_DIR}/tmp"
GZ="${ORIG}/de-en.tgz"
mkdir -p "${ORIG}" "${RAW}" "${TMP}"

# ------------------------------------------------------------------ download
is_valid_archive() {
    # (grep without -q reads the whole listing, so tar never dies of SIGPIPE under pipefail)
    [ -s "$1" ] && tar -tzf "$1" 2>/dev/null \
        | grep -E "^(\./)?${lang}/train\.tags\.${lang}\.${src}\$" >/dev/null
}

download() {  # download URL DEST
    local url="$1" dest="$2"
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --retry 2 --connect-timeout 20 -o "${dest}" "${url}"
    elif command -v wget >/dev/null 2>&1; then
        wget --tries=2 --timeout=20 -O "${dest}" "${url}"
    else
        die "neither curl nor wget is installed; download de-en.tgz by hand and pass -t FILE"
    fi
}

if [ -n "${IWSLT14_TGZ}" ]; then
    [ -f "${IWSLT14_TGZ}" ] || die "local archive not found: ${IWSLT14_TGZ}"
    is_valid_archive "${IWSLT14_TGZ}" || die "${IWSLT14_TGZ} is not the IWSLT14 de-en.tgz archive"
    GZ="${IWSLT14_TGZ}"
    log "using local archive ${GZ}"
elif is_valid_archive "${GZ}"; then
    log "archive already downloaded: ${GZ}"
else
    ok=0
    for url in ${IWSLT14_URLS}; do
        log "downloading ${url} ..."
        if download "${url}" "${GZ}.part" && is_valid_archive "${GZ}.part"; then
            mv "${GZ}.part" "${GZ}"
            ok=1
            break
        fi
        log "download from ${url} failed or did not give a valid de-en.tgz"
        rm -f "${GZ}.part"
    done
    if [ "${ok}" -ne 1 ]; then
        die "could not download the IWSLT14 de-en archive from: ${IWSLT14_URLS}
       Are you offline, or behind a proxy? Check the network connection.
       Download de-en.tgz elsewhere and rerun with: $0 -t /path/to/de-en.tgz"
    fi
fi
if command -v md5sum >/dev/null 2>&1; then
    log "archive md5: $(md5sum "${GZ}" | cut -d' ' -f1)"
fi

log "extracting ${GZ}"
tar -xzf "${GZ}" -C "${ORIG}"
IN="${ORIG}/${lang}"

# ------------------------------------------------------------------ train (tags stripped)
for l in "${src}" "${tgt}"; do
    f="${IN}/train.tags.${lang}.${l}"
    [ -f "${f}" ] || die "missing ${f} in the archive"
    grep -v '<url>' "${f}" \
        | grep -v '<talkid>' \
        | grep -v '<keywords>' \
        | sed -e 's/<title>//g' -e 's/<\/title>//g' \
              -e 's/<description>//g' -e 's/<\/description>//g' \
              -e 's/\r$//' \
        > "${TMP}/train.tags.${lang}.${l}"
done

# ------------------------------------------------------------------ test (dev/tst XML)
TEST_SETS="IWSLT14.TED.dev2010 IWSLT14.TEDX.dev2012 IWSLT14.TED.tst2010 IWSLT14.TED.tst2011 IWSLT14.TED.tst2012"
for l in "${src}" "${tgt}"; do
    : > "${TMP}/test.${l}"
    for name in ${TEST_SETS}; do
        x="${IN}/${name}.${lang}.${l}.xml"
        [ -f "${x}" ] || die "missing ${x} in the archive"
        grep '<seg id' "${x}" \
            | sed -e 's/<seg id="[0-9]*">[[:space:]]*//g' \
                  -e 's/[[:space:]]*<\/seg>[[:space:]]*//g' \
                  -e "s/’/'/g" \
            >> "${TMP}/test.${l}"
    done
done

# ------------------------------------------------------------------ clean, split, lowercase
log "cleaning train (1..175 tokens, ratio 1.5), valid = every 23rd line, test = dev/tst sets"
"${PYTHON}" - "${TMP}" "${RAW}" "${src}" "${tgt}" "${lang}" "${LOWERCASE}" <<'PY'
import sys
from pathlib import Path

tmp, raw, src, tgt, lang, lowercase = sys.argv[1:7]
tmp, raw, lowercase = Path(tmp), Path(raw), lowercase == "1"
MIN_LEN, MAX_LEN, RATIO = 1, 175, 1.5


def norm(line):
    line = " ".join(line.split())  # collapse whitespace, strip
    return line.lower() if lowercase else line


def read(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


s_lines = read(tmp / f"train.tags.{lang}.{src}")
t_lines = read(tmp / f"train.tags.{lang}.{tgt}")
if len(s_lines) != len(t_lines):
    sys.exit(f"ERROR: train.tags has {len(s_lines)} {src} lines but {len(t_lines)} {tgt} lines")

kept = []
for s, t in zip(s_lines, t_lines):
    s, t = norm(s), norm(t)
    ns, nt = len(s.split()), len(t.split())
    if not (MIN_LEN <= ns <= MAX_LEN and MIN_LEN <= nt <= MAX_LEN):
        continue
    if ns / nt > RATIO or nt / ns > RATIO:
        continue
    kept.append((s, t))

# like `awk 'NR%23 == 0'` on the cleaned corpus: 1-based line numbers divisible by 23 -> valid
splits = {"train": [], "valid": []}
for i, pair in enumerate(kept, start=1):
    splits["valid" if i % 23 == 0 else "train"].append(pair)

test_s = [norm(x) for x in read(tmp / f"test.{src}")]
test_t = [norm(x) for x in read(tmp / f"test.{tgt}")]
if len(test_s) != len(test_t):
    sys.exit(f"ERROR: test has {len(test_s)} {src} lines but {len(test_t)} {tgt} lines")
splits["test"] = list(zip(test_s, test_t))

for name, pairs in splits.items():
    for k, lg in ((0, src), (1, tgt)):
        with open(raw / f"{name}.{lg}", "w", encoding="utf-8", newline="\n") as f:
            f.writelines(p[k] + "\n" for p in pairs)
print(f"[prepare_iwslt14] train.tags pairs {len(s_lines)}, kept after cleaning {len(kept)}; "
      f"train {len(splits['train'])}, valid {len(splits['valid'])}, test {len(splits['test'])} "
      "(fairseq's Moses-tokenized version: 160239 / 7283 / 6750)", file=sys.stderr)
PY

# ------------------------------------------------------------------ SentencePiece + binarize
log "SentencePiece (${SPM_MODEL_TYPE}, vocab ${VOCAB_SIZE}) + fairseq-preprocess into ${OUT_DIR}/bin"
dict_args=()
[ "${SEPARATE_DICTS}" = 1 ] && dict_args=(--separate-dicts)
"${PYTHON}" "${SCRIPT_DIR}/prepare_corpus.py" "${RAW}" \
    --src "${src}" --tgt "${tgt}" \
    --vocab-size "${VOCAB_SIZE}" \
    --model-type "${SPM_MODEL_TYPE}" \
    --character-coverage 1.0 \
    --workers "${WORKERS}" \
    --out "${OUT_DIR}" \
    --overwrite \
    "${dict_args[@]}"

log "done: fairseq data in ${OUT_DIR}/bin (SentencePiece model: ${OUT_DIR}/bin/spm.model)"
