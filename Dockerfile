# syntax=docker/dockerfile:1
# Multi-stage build: `docker build --target server .` for the portal (with its UI assets),
# `docker build --target agent .` for the node agent (with JupyterLab for its notebooks).

FROM rust:1.95-bookworm AS build
WORKDIR /src
RUN rustup target add wasm32-unknown-unknown
COPY . .
# Release server, agent and wasm bundle (site assets land in target/site/pkg).
RUN cargo xtask build --release

FROM debian:bookworm-slim AS server
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /var/lib/tessera --create-home tessera
COPY --from=build /src/target/release/tessera /usr/local/bin/tessera
COPY --from=build /src/target/site /usr/share/tessera/site
USER tessera
WORKDIR /var/lib/tessera
ENV TESSERA_BIND=0.0.0.0:3000 \
    TESSERA_SITE_ROOT=/usr/share/tessera/site \
    TESSERA_NO_SIM=true \
    TESSERA_DATABASE_URL=sqlite:///var/lib/tessera/tessera.db?mode=rwc
EXPOSE 3000
HEALTHCHECK CMD ["/bin/sh", "-c", "exec 3<>/dev/tcp/127.0.0.1/3000"]
ENTRYPOINT ["tessera"]
CMD ["serve"]

# JupyterLab for the notebooks the agent's local executor runs: a virtual environment of
# Debian's python3, copied into the agent image below (same Python, same path).
FROM debian:bookworm-slim AS jupyter
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/tessera/jupyter \
 && /opt/tessera/jupyter/bin/pip install --no-cache-dir --disable-pip-version-check \
      jupyterlab==4.6.6 \
 && PATH=/usr/bin:/bin /opt/tessera/jupyter/bin/jupyter lab --version

FROM debian:bookworm-slim AS agent
# crun: the workload sandbox; nftables and iproute2: each workload's network of its own
# (docs/security.md). python3: the interpreter of the notebook environment (its bin/python
# links to /usr/bin/python3).
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates crun python3 \
    nftables iproute2 \
 && rm -rf /var/lib/apt/lists/*
# libnvidia-ml.so.1 comes from the host driver (NVIDIA container toolkit) at run time.
COPY --from=build /src/target/release/tessera-agent /usr/local/bin/tessera-agent
# Notebooks' `jupyter` comes from here (agent/README.md, "Notebook environment"); /opt is
# one of the system folders every sandbox sees read-only.
COPY --from=jupyter /opt/tessera/jupyter /opt/tessera/jupyter
ENV TESSERA_AGENT_NOTEBOOK_ENV=/opt/tessera/jupyter
ENTRYPOINT ["tessera-agent"]
