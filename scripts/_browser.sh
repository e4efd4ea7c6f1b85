# Sourced by scripts/test: a Chromium for the console's browser tests (tests/integration/console),
# Debian's chromium-headless-shell, installed with apt when missing (CI runs as root). Playwright
# drives it through its executable path; `playwright install` (a browser download) is never used.
browser_found() {
    for candidate in "${H3_CHROMIUM:-}" /usr/bin/chromium-headless-shell /usr/lib/chromium/chromium-headless-shell /usr/bin/chromium; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then
            return 0
        fi
    done
    return 1
}
if ! browser_found; then
    if command -v apt-get >/dev/null 2>&1; then
        as_root=()
        if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then
            as_root=(sudo)
        fi
        echo "installing chromium-headless-shell for the console's browser tests" >&2
        "${as_root[@]}" apt-get install -y chromium-headless-shell \
            || { "${as_root[@]}" apt-get update && "${as_root[@]}" apt-get install -y chromium-headless-shell; } \
            || echo "could not install chromium-headless-shell: the browser tests will fail (set H3_CHROMIUM to a Chromium)" >&2
    else
        echo "no apt-get: install Chromium and set H3_CHROMIUM, or the browser tests will fail" >&2
    fi
fi
# The whole suite run by this script needs the browser: its tests fail rather than skip without one.
export H3_REQUIRE_BROWSER=1
# axe-core for the accessibility tests, fetched once from the npm registry and checked (tests/axe.py).
(cd "$ROOT" && "$VENV/bin/python" -m tests.axe >/dev/null) || echo "could not fetch axe-core: the accessibility tests will fail" >&2
