# Shared by scripts/test, scripts/run and .ci/run. Source it; do not execute it.
#
# - DOCKET_ROOT: the repository root.
# - CARGO_TARGET_DIR: defaults to a directory outside the clone, so every clone on a machine
#   (and every CI run, which starts from a fresh clone) reuses one build of RocksDB.
# - ensure_prereqs [test]: installs what a fresh Debian machine with only the Rust toolchain
#   lacks (with `test`, also what the tests use: libfaketime, iproute2, munge, MPI, promtool,
#   Chromium).
# - stage NAME CMD...: runs CMD, prints its elapsed time, records failures in FAILED_STAGES.

DOCKET_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export DOCKET_ROOT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/docket/target}"
FAILED_STAGES=()

log() { printf '==> %s\n' "$*" >&2; }

# Runs a command as root: directly when we are root, through sudo otherwise.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    log "need root to run: $*  (not root and no sudo)"
    return 1
  fi
}

APT_UPDATED=0
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    log "missing system packages: $*; this is not a Debian/Ubuntu machine, install them by hand"
    return 1
  fi
  if [ "$APT_UPDATED" -eq 0 ]; then
    log "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
    APT_UPDATED=1
  fi
  log "apt-get install -y $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

deb_installed() {
  command -v dpkg-query >/dev/null 2>&1 &&
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

# libclang (RocksDB's bindgen loads it at build time): the Debian package, or LIBCLANG_PATH.
have_libclang() {
  [ -n "${LIBCLANG_PATH:-}" ] && return 0
  deb_installed libclang-dev && return 0
  command -v dpkg-query >/dev/null 2>&1 && return 1
  # Not Debian: look where clang-sys looks.
  compgen -G '/usr/lib*/libclang*.so*' >/dev/null || compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null
}

ensure_prereqs() {
  if ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found: install the Rust toolchain (rustup) first"
    return 1
  fi
  local pkgs=()
  have_libclang || pkgs+=(libclang-dev)
  # RocksDB is C++; rustup's toolchain needs only a C linker.
  command -v c++ >/dev/null 2>&1 || pkgs+=(g++)
  command -v cc >/dev/null 2>&1 || pkgs+=(gcc)
  # libbpf (the cgroup v2 device program that keeps a job off the GPUs it was not given) is
  # built from source against libelf and zlib.
  if command -v dpkg-query >/dev/null 2>&1; then
    deb_installed libelf-dev || pkgs+=(libelf-dev)
    deb_installed zlib1g-dev || pkgs+=(zlib1g-dev)
    command -v pkg-config >/dev/null 2>&1 || pkgs+=(pkg-config)
    command -v make >/dev/null 2>&1 || pkgs+=(make)
  fi
  # The tests: libfaketime makes one replica's clock jump (chaos/); iproute2 makes the network
  # namespaces partitions are cut in; munge is the real munged auth/munge is tested against.
  if [ "${1:-}" = test ] && command -v dpkg-query >/dev/null 2>&1; then
    deb_installed libfaketime || pkgs+=(libfaketime)
    command -v ip >/dev/null 2>&1 || pkgs+=(iproute2)
    command -v munged >/dev/null 2>&1 || pkgs+=(munge)
    # MPICH and Open MPI: an MPI program across two agents, each launcher's daemons started
    # by srun (deploy/).
    command -v mpicc.mpich >/dev/null 2>&1 || pkgs+=(mpich libmpich-dev)
    command -v mpicc.openmpi >/dev/null 2>&1 || pkgs+=(openmpi-bin libopenmpi-dev)
    command -v python3 >/dev/null 2>&1 || pkgs+=(python3 python3-venv)
    # promtool checks and unit-tests the alert rules in deploy/prometheus; Chromium renders
    # the controllers' status page (controller/tests/web.rs).
    command -v promtool >/dev/null 2>&1 || pkgs+=(prometheus)
    [ -x /usr/bin/chromium ] || pkgs+=(chromium)
  fi
  if [ "${#pkgs[@]}" -gt 0 ]; then
    apt_install "${pkgs[@]}" || return 1
  fi
  # The Python tools deploy/'s compatibility tests drive a cluster with, from PyPI: submitit
  # (a job launcher) and dask-jobqueue (SLURMCluster and PBSCluster), pinned.
  if [ "${1:-}" = test ]; then
    local venv="$CARGO_TARGET_DIR/python-tools-venv"
    local want="submitit==1.5.4 dask-jobqueue==0.9.0 dask==2026.8.0 distributed==2026.8.0"
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.docket-pins" 2>/dev/null)" != "$want" ]; then
      log "python3 -m venv $venv && pip install $want (one-time)"
      rm -rf "$venv"
      # shellcheck disable=SC2086 # the pins are words
      python3 -m venv "$venv" && "$venv/bin/pip" install --quiet $want || return 1
      printf '%s' "$want" >"$venv/.docket-pins"
    fi
    export DOCKET_TEST_PYTHON="$venv/bin/python"
  fi
  # cargo-nextest runs every test binary with per-test processes and hard timeouts.
  if ! cargo nextest --version >/dev/null 2>&1; then
    log "cargo install cargo-nextest --locked (one-time)"
    cargo install --quiet cargo-nextest --locked || return 1
  fi
}

stage() {
  local name=$1
  shift
  local start=$SECONDS rc=0
  log "stage $name: $*"
  "$@" || rc=$?
  local took=$((SECONDS - start))
  if [ "$rc" -eq 0 ]; then
    printf '==> stage %-14s ok      %4ds\n' "$name" "$took" >&2
  else
    printf '==> stage %-14s FAILED  %4ds (exit %d)\n' "$name" "$took" "$rc" >&2
    FAILED_STAGES+=("$name")
  fi
  STAGE_TIMES+=("$(printf '%-14s %5ds  %s' "$name" "$took" "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)")")
  return "$rc"
}
STAGE_TIMES=()

print_stage_times() {
  printf '\n==> stage times\n' >&2
  local line
  for line in "${STAGE_TIMES[@]}"; do printf '    %s\n' "$line" >&2; done
}
