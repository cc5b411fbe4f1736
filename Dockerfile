# lease-proxy and fence-gateway in one image; pick the binary with the container command.
#   docker build -t lease-proxy .
#   docker run --rm lease-proxy lease-proxy --help
#   docker run --rm lease-proxy fence-gateway --help
# The oldest Rust the locked dependencies build with (uuid 1.29 needs 1.89; tonic 0.14.9 1.88).
FROM rust:1.89-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p lease-proxy -p fencing --features fencing/server --bins

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home /var/lib/lease-proxy lease-proxy \
    && mkdir -p /var/lib/lease-proxy && chown lease-proxy /var/lib/lease-proxy
COPY --from=build /src/target/release/lease-proxy /src/target/release/fence-gateway /usr/local/bin/
USER 10001
WORKDIR /var/lib/lease-proxy
# Both binaries drain on SIGTERM: readiness turns 503, in-flight requests finish.
STOPSIGNAL SIGTERM
EXPOSE 7070 7071
CMD ["lease-proxy", "--listen", "0.0.0.0:7070"]
