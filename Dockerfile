# The recon_dagster code location as an image: a gRPC code server on port 3030, which is what
# the Dagster Helm chart's user deployment runs (see deploy/helm/values.yaml). Run workers started
# by the K8sRunLauncher use this same image; so can dagster-daemon (`dagster-daemon run -w
# deploy/workspace.yaml` style deployments, docs/deploying.md).
#
#   docker build -t recon-dagster:<version> .
#   docker run -p 3030:3030 -e RECON_DATABASE_URL=... -e KIE_API_KEY=... recon-dagster:<version>
#
# EXTRAS (comma-separated, default k8s) picks the extras installed beside the runtime:
# `--build-arg EXTRAS=k8s,webserver` gives an image that can also run dagster-webserver.
#
# Reproducible: every third-party package comes from uv.lock, at the locked version and with its
# hashes (pip --require-hashes refuses anything else), so two builds a day apart install the same
# files. The runtime and the `k8s` extra by default: no embedded PostgreSQL, no webserver, no dev tools.
#
# Two stages: the first turns uv.lock into a hashed requirements file and builds the wheel (the
# package, with migrations/*.sql inside it as recon_dagster/db/migrations/, see setup.py); the
# second installs those and nothing else from the repository, so the image runs exactly what a
# `pip install` of the wheel with the locked dependencies runs.

FROM python:3.11-slim AS wheel

ARG EXTRAS=k8s
WORKDIR /src
# The build's own tools, pinned to the versions uv.lock holds (a test keeps these two in step).
RUN pip install --no-cache-dir "uv==0.13.9" "setuptools==84.2.1"
# What the build reads: the project metadata and lock, the package, and the SQL that setup.py copies in.
COPY pyproject.toml uv.lock setup.py MANIFEST.in README.md ./
COPY recon_dagster ./recon_dagster
COPY migrations ./migrations
# --frozen: use uv.lock as it is (CI's `uv lock --check` keeps it in step with pyproject.toml).
RUN uv export --frozen --no-dev --no-emit-project $(printf -- '--extra %s ' $(echo "$EXTRAS" | tr ',' ' ')) \
        --format requirements-txt --output-file /wheels/requirements.txt \
    && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .


FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home

WORKDIR /opt/recon_dagster

COPY --from=wheel /wheels /tmp/wheels
# The locked dependencies first (hashes required, wheels only), then the project's wheel on top of
# them without resolving anything again; `pip check` fails the build if the two disagree.
# dagster-k8s (the `k8s` extra): runs launched as Kubernetes jobs load the instance in this image.
# First the pip of deploy/pip.txt, by its hash: a pip before 23.3 refuses the lock's gql[requests]
# in --require-hashes mode, and the base image's pip is whatever the image ships.
RUN printf 'pip==24.0 --hash=sha256:ba0d021a166865d2265246961bec0152ff124de910c5cc39f1156ce3fa7c69dc\n' > /tmp/pip.txt \
    && pip install --no-cache-dir --require-hashes --only-binary=:all: -r /tmp/pip.txt \
    && pip install --no-cache-dir --require-hashes --only-binary=:all: -r /tmp/wheels/requirements.txt \
    && pip install --no-cache-dir --no-deps /tmp/wheels/recon_dagster-*.whl \
    && pip check \
    && rm -rf /tmp/wheels \
    && mkdir -p "$DAGSTER_HOME" \
    && useradd --create-home --uid 10001 dagster \
    && mkdir -p /var/lib/recon-dagster/media \
    && chown -R dagster "$DAGSTER_HOME" /var/lib/recon-dagster

# Instance config for runs launched in this image (the Helm chart mounts its own over it).
COPY dagster.yaml "$DAGSTER_HOME/dagster.yaml"

USER dagster
EXPOSE 3030
# Secrets (RECON_DATABASE_URL, provider keys, DAGSTER_POSTGRES_URL) come from the environment
# at run time, never from the image; without RECON_DATABASE_URL the server refuses to start.
# `recon-dagster migrate` works in this image as well: the SQL it applies is inside the wheel.
CMD ["dagster", "api", "grpc", "-m", "recon_dagster.definitions", "--location-name", "recon_dagster", "-h", "0.0.0.0", "-p", "3030"]
