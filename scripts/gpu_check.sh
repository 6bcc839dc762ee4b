#!/usr/bin/env bash
# The GPU check (docs/gpu.md), run on a lent GPU machine from the repository root: installs the wheels that
# scripts/gpu_prepare.sh put in .gpu/wheels, reads the data from .gpu/data, runs
# `python -m electra_ablate.bench.gpu_check` (about 8 minutes), writing the report to $OUT (the lent machine's folder
# that comes back) where it is set, else to reports/benchmarks_gpu.md. Arguments go to gpu_check (e.g. --smoke).
#   bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".gpu/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_site \
    .gpu/wheels/*.whl || exit 1
  export PYTHONPATH="/tmp/gpu_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DATA_ARGS=()
[ -d .gpu/data/corpus ] && DATA_ARGS=(--data-dir .gpu/data)
# Every carried package imports, and MLflow opens a SQLite store: a missing one is named here, in seconds.
python3 -c "import hydra, omegaconf, sqlalchemy, alembic, hydra_plugins.hydra_joblib_launcher, tempfile
from mlflow.tracking import MlflowClient
MlflowClient('sqlite:///' + tempfile.mkdtemp() + '/probe.db').search_experiments(); print('packages: ok')" \
  || echo "packages: the import above failed; add the missing wheel to scripts/gpu_prepare.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>/dev/null || true
# With $OUT, the report is rewritten there after every part: it comes back even if the call is cut short.
OUT_ARGS=()
[ -n "${OUT:-}" ] && OUT_ARGS=(--out "$OUT/benchmarks_gpu.md")
python3 -m electra_ablate.bench.gpu_check "${DATA_ARGS[@]}" "${OUT_ARGS[@]}" "$@"
rc=$?
if [ -n "${OUT:-}" ]; then
  (cd outputs/gpu_check && tar czf "$OUT/gpu_check_parts.tgz" ./*.log ./*.md ./*.json ./*.csv 2>/dev/null)
fi
exit $rc
