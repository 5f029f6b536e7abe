#!/usr/bin/env bash
# Builds the guests written for the Python and JavaScript toolchains into
# components, the way their users build them:
#
#   guests/py-hello  (componentize-py)          -> py-hello.wasm
#   guests/js-hello  (componentize-js, explicit incomingHandler) -> js-hello.wasm
#   guests/js-fetch  (componentize-js, addEventListener("fetch")) -> js-fetch.wasm
#
# into guests/target/toolchains/ (or $1). The toolchains are installed there
# at the pinned versions below, from PyPI and npm, the first time; a
# component is rebuilt only when its source or a toolchain changed.
#
# The WIT they build against is the one Weir serves: the wasi:http 0.2 WIT
# of the wasmtime-wasi-http crate Weir is built with (found with `cargo
# metadata`). StarlingMonkey (inside componentize-js) implements the fetch
# event against one wasi:http 0.2 patch version of its own; the fetch-event
# app's world must export that exact version, so it is read from the
# engine and the same WIT is given that version number.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1
COMPONENTIZE_JS_VERSION=0.23.0
WASI_HTTP_WORLD=wasi:http/proxy@0.2.12
# Tries of each toolchain install before giving up: a registry that drops
# a connection fails an install in seconds.
INSTALL_ATTEMPTS=3

guests="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$guests")"
out="${1:-$guests/target/toolchains}"
tools="$out/tools"
mkdir -p "$tools"

say() { echo "toolchains: $*" >&2; }

# --- the toolchains ----------------------------------------------------
# install NAME LOG_DIR COMMAND...: runs COMMAND (which starts from nothing
# each time) until it succeeds, INSTALL_ATTEMPTS times at most. After each
# failure it shows the free disk and the error and warning lines the
# installer wrote to LOG_DIR (npm reports a failed write as a warning), so
# the last lines of a failed run say why.
install() {
    local name="$1" logs="$2"
    shift 2
    local attempt=1
    until rm -rf "$logs" && mkdir -p "$logs" && "$@" >&2; do
        df -h "$out" | sed 's/^/toolchains:   /' >&2
        grep -h -E '( error | warn |ERROR:|WARNING:)' "$logs"/* 2>/dev/null | tail -n 20 | sed 's/^/toolchains:   /' >&2 || true
        say "installing $name failed (attempt $attempt of $INSTALL_ATTEMPTS); its errors are above"
        if [ "$attempt" -ge "$INSTALL_ATTEMPTS" ]; then
            say "giving up on $name: the guests built with it cannot be built"
            exit 1
        fi
        sleep $((attempt * 10))
        attempt=$((attempt + 1))
    done
    rm -rf "$logs"
}

py="$tools/py-$COMPONENTIZE_PY_VERSION"
install_py() {
    rm -rf "$py"
    python3 -m venv "$py"
    "$py/bin/pip" install --quiet --disable-pip-version-check \
        --log "$out/pip-logs/pip.log" \
        "componentize-py==$COMPONENTIZE_PY_VERSION"
}
if [ ! -x "$py/bin/componentize-py" ]; then
    say "installing componentize-py $COMPONENTIZE_PY_VERSION (PyPI)"
    install componentize-py "$out/pip-logs" install_py
fi

js="$tools/js-$COMPONENTIZE_JS_VERSION"
cjs="$js/node_modules/@bytecodealliance/componentize-js"
install_js() {
    # Warnings shown: npm reports a failed write (a full disk) as one.
    rm -rf "$js"
    mkdir -p "$js"
    npm install --prefix "$js" --no-audit --no-fund --loglevel=warn \
        --logs-dir="$out/npm-logs" \
        "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION"
}
if [ ! -f "$cjs/src/cli.js" ]; then
    say "installing componentize-js $COMPONENTIZE_JS_VERSION (npm)"
    install componentize-js "$out/npm-logs" install_js
fi

# --- the WIT Weir serves -------------------------------------------------
wit="$(cargo metadata --format-version 1 --manifest-path "$root/Cargo.toml" | python3 -c '
import json, os, sys
meta = json.load(sys.stdin)
for package in meta["packages"]:
    if package["name"] == "wasmtime-wasi-http":
        print(os.path.join(os.path.dirname(package["manifest_path"]), "wit"))
        break
')"
if [ ! -d "$wit/deps" ]; then
    say "cannot find the wasi:http WIT of wasmtime-wasi-http (looked in '$wit')"
    exit 1
fi

# StarlingMonkey's own wasi:http version, read from its engine.
engine="$cjs/lib/starlingmonkey_embedding.wasm"
sm_version="$(python3 - "$engine" <<'EOF'
import re, sys
found = set(re.findall(rb"wasi:http/incoming-handler@(0\.2\.[0-9]+)", open(sys.argv[1], "rb").read()))
if len(found) != 1:
    sys.exit(f"expected one wasi:http version in {sys.argv[1]}, found {sorted(found)}")
print(found.pop().decode())
EOF
)"
served_version="${WASI_HTTP_WORLD##*@}"
fetch_wit="$out/wit-fetch-event-$sm_version"
if [ ! -f "$fetch_wit/world.wit" ] || [ "$wit/deps" -nt "$fetch_wit/world.wit" ]; then
    rm -rf "$fetch_wit"
    mkdir -p "$fetch_wit/deps"
    for file in "$wit"/deps/*.wit; do
        # Every version number, feature gates included (a gate newer than
        # its package is refused).
        sed "s/${served_version//./\\.}/$sm_version/g" "$file" > "$fetch_wit/deps/$(basename "$file")"
    done
    cat > "$fetch_wit/world.wit" <<EOF
package weir:fetch-event;

world fetch-event {
  import wasi:cli/environment@$sm_version;
  export wasi:http/incoming-handler@$sm_version;
}
EOF
fi

# --- the components ------------------------------------------------------
# Rebuilt when the source, the toolchain or the WIT is newer than the output.
stale() {
    local target="$1"
    shift
    [ ! -s "$target" ] && return 0
    local input
    for input in "$@"; do
        [ "$input" -nt "$target" ] && return 0
    done
    return 1
}

if stale "$out/py-hello.wasm" "$guests/py-hello/app.py" "$py/bin/componentize-py" "$wit/deps/http.wit"; then
    say "building py-hello.wasm (componentize-py $COMPONENTIZE_PY_VERSION)"
    (cd "$guests/py-hello" && PYTHONDONTWRITEBYTECODE=1 "$py/bin/componentize-py" -d "$wit" -w "$WASI_HTTP_WORLD" \
        componentize app -o "$out/py-hello.wasm.tmp" >&2)
    mv "$out/py-hello.wasm.tmp" "$out/py-hello.wasm"
fi

if stale "$out/js-hello.wasm" "$guests/js-hello/app.js" "$cjs/src/cli.js" "$wit/deps/http.wit"; then
    say "building js-hello.wasm (componentize-js $COMPONENTIZE_JS_VERSION)"
    node "$cjs/src/cli.js" "$guests/js-hello/app.js" -w "$wit" -n "$WASI_HTTP_WORLD" \
        -o "$out/js-hello.wasm.tmp" >&2
    mv "$out/js-hello.wasm.tmp" "$out/js-hello.wasm"
fi

if stale "$out/js-fetch.wasm" "$guests/js-fetch/app.js" "$cjs/src/cli.js" "$fetch_wit/world.wit"; then
    say "building js-fetch.wasm (componentize-js $COMPONENTIZE_JS_VERSION, fetch event, wasi:http $sm_version)"
    node "$cjs/src/cli.js" "$guests/js-fetch/app.js" -w "$fetch_wit" -n fetch-event \
        -o "$out/js-fetch.wasm.tmp" >&2
    mv "$out/js-fetch.wasm.tmp" "$out/js-fetch.wasm"
fi

echo "$out"
