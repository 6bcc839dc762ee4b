#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for the GPU check on a lent machine (docs/gpu.md), here, where the package registry and
# the data are: .gpu/wheels holds the Python packages the project needs that the lent machine's image lacks (its
# image has torch, Lightning, transformers, tokenizers, pandas, scikit-learn, joblib and their kin; not Hydra, not
# MLflow), for CPython 3.12 on x86-64 Linux; .gpu/data holds the Wikipedia sample, the BERT vocabulary and SST-2, laid
# out as the shared data folder is. Nothing can be fetched there, so everything travels with the working tree.
#   bash scripts/gpu_prepare.sh            (then carry .gpu: docs/gpu.md)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${ELECTRA_ABLATE_DATA:-../shared/data}"
rm -rf .gpu/wheels && mkdir -p .gpu/wheels .gpu/data/corpus .gpu/data/vocab .gpu/data/glue
# The versions the project's tests pass with; --no-deps, so every dependency the image lacks is named here.
WHEELS=(
  hydra-core==1.3.8 omegaconf==2.3.1 hydra-joblib-launcher==1.2.0
  mlflow-skinny==3.17.2 mlflow-tracing==3.17.2 sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 sqlparse==0.6.1
  databricks-sdk==0.162.0 google-auth==2.63.0 pyasn1==0.6.5 pyasn1-modules==0.4.2 cryptography cffi pycparser
  cachetools==7.3.3 importlib-metadata==9.1.0 python-dotenv==1.2.4 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu/wheels "${WHEELS[@]}"
# antlr4's runtime (Hydra's parser) is published as source only: built into a pure-Python wheel here.
python3 -m pip wheel -q --no-deps -w .gpu/wheels antlr4-python3-runtime==4.9.3
cp "$DATA/corpus/enwiki_sample_5mb.txt" .gpu/data/corpus/
cp "$DATA/vocab/bert-base-uncased-vocab.txt" .gpu/data/vocab/
cp -r "$DATA/glue/SST-2" .gpu/data/glue/
du -sh .gpu/wheels .gpu/data
