#!/usr/bin/env bash
# Runs the HF oracle over the cases that make_cases.sh wrote (on the machine with torch +
# transformers). usage: [DSV4=path/to/dsv4] tools/hf/run_suite.sh CASEDIR RESULTDIR [DTYPES]
# A missing <case>.gguf is rebuilt with $DSV4 synth from cases.txt and checked against
# SHA256SUMS. RESULTDIR gets keys-<model>.txt (HF state_dict vs the GGUF mapping),
# suite.log, and results.tgz (per case: a JSON summary and HF's logits per precision).
set -uo pipefail
HERE=$(dirname "$(realpath "$0")")
C=$(realpath "$1")
R=$(realpath -m "$2")
DT=${3:-fp64,fp32,fp64-strict}
mkdir -p "$R" "$C/hf"
export PYTHONUNBUFFERED=1
{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
    python3 -c "import sys,torch,transformers,numpy;print('python',sys.version.split()[0],'torch',torch.__version__,'transformers',transformers.__version__,'numpy',numpy.__version__,'cuda',torch.cuda.is_available())"
    while IFS='|' read -r n args; do
        if [ ! -f "$C/$n.gguf" ]; then
            # shellcheck disable=SC2086
            "${DSV4:?no $n.gguf and DSV4 is unset}" synth $args --vocab byte -o "$C/$n.gguf" < /dev/null 2>&1 | tail -1
        fi
    done < "$C/cases.txt"
    (cd "$C" && sha256sum -c SHA256SUMS) || echo "SHA256 MISMATCH: the GGUFs differ from the ones dsv4 ran on"
} 2>&1 | tee "$R/suite.log"
for m in tiny small; do
    first=$(ls "$C"/$m-*.gguf 2>/dev/null | head -1)
    [ -n "$first" ] && python3 "$HERE/hf_logits.py" keys "$first" > "$R/keys-$m.txt" 2>&1
done
rc=0
while IFS='|' read -r n args; do
    python3 "$HERE/hf_logits.py" run --gguf "$C/$n.gguf" --tokens "$C/$n.tok" --ours "$C/$n.ours.bin" \
        --dtypes "$DT" --json "$C/hf/$n.json" --out-prefix "$C/hf/$n" < /dev/null 2>&1 | tee -a "$R/suite.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
done < "$C/cases.txt"
tar czf "$R/results.tgz" -C "$C" hf
exit $rc
