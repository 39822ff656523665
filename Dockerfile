# The recon_dagster code location as an image: a gRPC code server on port 3030, which is what
# the Dagster Helm chart's user deployment runs (see deploy/helm/values.yaml). Run workers started
# by the K8sRunLauncher use this same image.
#
#   docker build -t recon-dagster:<version> .
#   docker run -p 3030:3030 -e RECON_DATABASE_URL=... -e KIE_API_KEY=... recon-dagster:<version>
#
# Two stages: the first builds the wheel (the package, with migrations/*.sql inside it as
# recon_dagster/db/migrations/, see setup.py); the second installs that wheel and nothing else
# from the repository, so the image runs exactly what a `pip install` of the wheel runs.

FROM python:3.11-slim AS wheel

WORKDIR /src
# What the build reads: the project metadata, the package, and the SQL that setup.py copies in.
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY recon_dagster ./recon_dagster
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .


FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home

WORKDIR /opt/recon_dagster

COPY --from=wheel /wheels /tmp/wheels
# dagster-k8s: runs launched as Kubernetes jobs load the instance (K8sRunLauncher) in this image.
RUN pip install --no-cache-dir /tmp/wheels/recon_dagster-*.whl "dagster-k8s==0.29.27" \
    && rm -rf /tmp/wheels \
    && mkdir -p "$DAGSTER_HOME" \
    && useradd --create-home --uid 10001 dagster \
    && chown -R dagster "$DAGSTER_HOME"

# Instance config for runs launched in this image (the Helm chart mounts its own over it).
COPY dagster.yaml "$DAGSTER_HOME/dagster.yaml"

USER dagster
EXPOSE 3030
# Secrets (RECON_DATABASE_URL, provider keys, DAGSTER_POSTGRES_URL) come from the environment
# at run time, never from the image. `recon-dagster migrate` works in this image as well: the SQL
# it applies is inside the installed wheel.
CMD ["dagster", "api", "grpc", "-m", "recon_dagster.definitions", "--location-name", "recon_dagster", "-h", "0.0.0.0", "-p", "3030"]
