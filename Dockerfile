# syntax=docker/dockerfile:1
# Build: a static binary (pure-Go SQLite, no cgo).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# make test-image runs this line as written (scripts/test-image.sh reads it).
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/moonji . && mkdir -p /out/data

# Run: no shell, no package manager, a non-root user, data on a volume.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/moonji /usr/local/bin/moonji
# The data directory belongs to the non-root user (65532 in distroless), or
# SQLite could not write there.
COPY --from=build --chown=65532:65532 /out/data /var/lib/moonji
WORKDIR /var/lib/moonji
VOLUME ["/var/lib/moonji"]
ENV MOONJI_LISTEN=0.0.0.0:8080 \
    MOONJI_DATABASE_URL=sqlite:///var/lib/moonji/moonji.db
EXPOSE 8080
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/moonji"]
CMD ["serve"]
