# What the matrix's jobs (.ci/jobs/*) share: Debian roots for the Pythons bookworm lacks,
# environments built from the registries and kept outside the clone, the test runs.
# Sourced, not run. Everything built lies under $CACHE (rebuilt when absent):
#   roots/SUITE      debootstrap of Debian SUITE (trixie: Python 3.13, forky: 3.14)
#   envs/NAME-KEY    a venv of a pins file (KEY: the interpreter, the pins, our requirements)
#   wheels/          every wheel an environment was built from (pip's HTTP cache is not
#                    kept here: the registry's answers say no-store), so a rebuild is offline
# A job exits 0 (passed), 1 (failed: tests, or a build that hit a registry error: never a
# pass) or $SKIPPED after writing why to $REASON (its interpreter or wheels do not exist).

CACHE=${NOTEBOOK_ACCEL_CI_CACHE:-/var/cache/notebook-accel}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS=$CACHE/wheels
SKIPPED=3
REASON=${REASON:-/dev/stderr}
# The run's time budget: the moment (epoch seconds) by which every job has ended (.ci/run
# sets it; 0: none). A job starts a build or its tests only when what that took last time
# (kept in $CACHE/times, else .ci/times: measured on a 2-core machine) fits in what is left;
# otherwise it is skipped, saying so. A cold environment is built only with the disk for it.
DEADLINE=${NOTEBOOK_ACCEL_CI_DEADLINE:-0}
TIMES=$CACHE/times
MIN_FREE_GB=${NOTEBOOK_ACCEL_CI_MIN_FREE_GB:-12}
mkdir -p "$CACHE/roots" "$CACHE/envs" "$WHEELS" "$TIMES"

say() { printf '[%s] %s\n' "${JOB:-ci}" "$*" >&2; }

skip() { # skip WHY: this job cannot run here, and says why
  say "skipped: $*"
  printf '%s\n' "$*" >>"$REASON"
  exit "$SKIPPED"
}

left() { # the seconds left of the run's budget (a large number where there is none)
  if [ "$DEADLINE" = 0 ]; then echo 999999; else echo $((DEADLINE - $(date +%s))); fi
}

took() { # took STEP: seconds STEP (JOB:build, JOB:tests, ...) took last time, else .ci/times'
  local found
  found=$(cat "$TIMES/$1" 2>/dev/null) ||
    found=$(awk -v step="$1" '$1 == step {print $2}' "$REPO/.ci/times" 2>/dev/null)
  echo "${found:-900}"
}

fits() { # fits STEP WHAT: skip the job unless STEP's last time (and a fifth more) fits
  local need have
  need=$(took "$1")
  have=$(left)
  [ "$have" -ge $((need + need / 5 + 30)) ] ||
    skip "time budget: $2 take about $((need / 60 + 1)) min, $((have / 60)) min left of the run"
}

timed() { # timed STEP CMD...: CMD, and on success its seconds kept as STEP's time
  local step=$1 start=$SECONDS
  shift
  "$@" || return $?
  echo $((SECONDS - start)) >"$TIMES/$step.tmp" && mv "$TIMES/$step.tmp" "$TIMES/$step"
}

retry() { # retry CMD...: three tries, 20 s apart (a registry's transient failure)
  local n
  for n in 1 2 3; do
    "$@" && return 0
    say "try $n of 3 failed: $*"
    [ "$n" = 3 ] || sleep 20
  done
  return 1
}

mirror() { # the Debian mirror this machine's apt sources name
  local uri
  uri=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null |
    grep -m1 '/debian$' || true)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 ~ /\/debian$/ {print $2; exit}' \
    /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

root() { # root SUITE: prints the path of a Debian root of SUITE, made when absent
  local suite=$1 dir=$CACHE/roots/$1 script
  if [ ! -e "$dir/.complete" ]; then
    [ "$(id -u)" = 0 ] || skip "a Debian $suite root needs root (debootstrap, chroot)"
    command -v debootstrap >/dev/null ||
      retry apt-get install -y -qq debootstrap >/dev/null ||
      { say "debootstrap could not be installed"; return 1; }
    # bookworm's debootstrap has no script for suites after trixie: they are made as sid is
    script=/usr/share/debootstrap/scripts/$suite
    [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
    say "debootstrap $suite from $(mirror) (once: kept in $dir)"
    _debootstrap() {
      rm -rf "$dir.tmp"
      debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
        "$suite" "$dir.tmp" "$(mirror)" "$script" >"$CACHE/roots/$suite.log" 2>&1
    }
    retry _debootstrap || { tail -5 "$CACHE/roots/$suite.log" >&2; return 1; }
    rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.complete"
  fi
  echo "$dir"
}

in_root() { # in_root DIR CMD...: CMD inside the root at DIR, in this directory, with /proc,
  # /dev, /sys, the clone and the cache at their paths, this machine's CAs and DNS, and a
  # clean environment (the host's pip settings name files the root does not have). The
  # mounts are private to the command (a mount namespace of its own): nothing to undo.
  local dir=$1
  shift
  unshare --mount --propagation private -- /bin/bash -c '
    set -e
    r=$1 repo=$2 cache=$3 here=$4
    shift 4
    mount --bind /proc "$r/proc"
    mount --rbind /dev "$r/dev"
    mount --bind /sys "$r/sys"
    for path in "$repo" "$cache/envs" "$cache/wheels"; do
      mkdir -p "$r$path"
      mount --bind "$path" "$r$path"
    done
    for file in /etc/ssl/certs/ca-certificates.crt /etc/resolv.conf; do
      [ -e "$r$file" ] || touch "$r$file"
      mount --bind "$file" "$r$file"
    done
    exec chroot "$r" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
      HOME=/root LANG=C.UTF-8 CI="${CI:-}" PIP_DISABLE_PIP_VERSION_CHECK=1 \
      PIP_DEFAULT_TIMEOUT=180 SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
      /bin/bash -c "cd \"\$0\" && exec \"\$@\"" "$here" "$@"
  ' in_root "$dir" "$REPO" "$CACHE" "$PWD" "$@"
}

at() { # at WHERE CMD...: CMD on this machine (WHERE=host) or inside the root WHERE
  local where=$1
  shift
  if [ "$where" = host ]; then
    # the host's pip reads the torch wheel on disk and its cap (pip's own settings)
    "$@"
  else
    in_root "$where" "$@"
  fi
}

requirements() { # our [project] dependencies, as pyproject.toml lists them
  sed -n '/^dependencies = \[/,/^\]/p' "$REPO/pyproject.toml"
}

env_for() { # env_for WHERE PYTHON PINS: prints the path of a venv holding PINS (a file of
  # pip requirements) and our requirements, built when absent. Built as a user's install
  # would go: the pins first, then the package with its dependencies; the build fails if
  # the package's install replaced any pinned version (pip's report says what it installs).
  local where=$1 python=$2 pins=$3 key dir name
  name=$(basename "$pins" .txt)
  key=$({
    at "$where" "$python" -VV
    cat "$pins"
    requirements
  } | sha256sum | cut -c1-12)
  dir=$CACHE/envs/$name-$key
  if [ ! -e "$dir/.complete" ]; then
    local free
    free=$(df -P -k "$CACHE" | awk 'NR == 2 {print int($4 / 1048576)}')
    [ "$free" -ge "$MIN_FREE_GB" ] ||
      skip "disk: building $name needs ${MIN_FREE_GB} GB free in $CACHE, $free GB are"
    fits "$JOB:build" "building $name (cold cache) would"
    timed "$JOB:build" _build_env "$where" "$python" "$pins" "$dir" >&2 || return 1
  else
    _build_env "$where" "$python" "$pins" "$dir" >&2 || return 1
  fi
  echo "$dir"
}

_build_env() { # what env_for prints goes to stderr: its stdout is the venv's path
  local where=$1 python=$2 pins=$3 dir=$4
  if [ ! -e "$dir/.complete" ]; then
    say "building $dir (once: a warm run reuses it)"
    rm -rf "$dir"
    at "$where" "$python" -m venv "$dir" || return 1
    # the wheels into the cache (those there already are not fetched again), then offline
    retry at "$where" "$dir/bin/pip" download -q --dest "$WHEELS" --find-links "$WHEELS" \
      -r "$pins" || return 1
    at "$where" "$dir/bin/pip" install -q --no-index --find-links "$WHEELS" -r "$pins" ||
      return 1
    retry at "$where" "$dir/bin/pip" install -q --find-links "$WHEELS" \
      --report "$dir/report.json" "$REPO" || return 1
    at "$where" "$dir/bin/python" - "$pins" "$dir/report.json" <<'EOF' || return 1
import json, re, sys
pinned = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, version = line.split("==")
        pinned[re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()] = version.strip()
installed = {
    re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(): item["metadata"]["version"]
    for item in json.load(open(sys.argv[2]))["install"]
}
replaced = {n: (pinned[n], v) for n, v in installed.items() if n in pinned and v != pinned[n]}
if replaced:
    sys.exit(f"installing notebook_accel replaced pinned versions: {replaced}")
print("installing notebook_accel kept every pin; it added:", sorted(installed))
EOF
    at "$where" "$dir/bin/pip" uninstall -q -y notebook_accel || return 1
    touch "$dir/.complete"
  fi
  # this clone, editable, over the cached environment (no index: its dependencies are there)
  at "$where" "$dir/bin/pip" install -q --no-index --no-deps --no-build-isolation -e "$REPO" \
    >/dev/null
}

run_tests() { # run_tests WHERE VENV PYTEST-ARGS...: pytest of this clone in VENV
  local where=$1 venv=$2 step=$JOB:tests${TESTS_PART:+:$TESTS_PART}
  shift 2
  fits "$step" "its tests would"
  [ -z "${TESTING:-}" ] || : >"$TESTING" # from here a job the budget stops has failed
  timed "$step" at "$where" "$venv/bin/python" -m pytest -p no:cacheprovider -q --durations=8 "$@"
}
