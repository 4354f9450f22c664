#!/usr/bin/env bash
# Mutation testing of the unit tier (issue 13; not part of CI): mutmut mutates the modules whose
# rules the unit tests pin and runs the unit tests that reach each mutant. It works on a scratch
# copy of the working tree (tracked and untracked, not ignored, files), so no mutated file can
# ever land in the repository. Prints killed/total per module and the survivors.
#
#   scripts/mutation.sh                       # every module below, 2 test processes
#   MUTATION_JOBS=4 scripts/mutation.sh       # more processes on a bigger machine
#   scripts/mutation.sh voicehost/ids.py      # only these modules (paths as below)
#
# A survivor's diff (its name is printed at the end), from the scratch copy:
#   cd /tmp/voicehost-mutation && /path/to/repo/.venv/bin/python -m mutmut show <name>
# Needs mutmut and cosmic-ray (pip install -e '.[test]'). 25-45 minutes on 2 busy cores.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
work=${MUTATION_DIR:-${TMPDIR:-/tmp}/voicehost-mutation}
python=${PYTHON:-$repo/.venv/bin/python}
jobs=${MUTATION_JOBS:-2}

modules=(
    voicehost/model/orpheus.py
    voicehost/text/segment.py
    voicehost/text/normalize.py
    voicehost/audio/formats.py
    voicehost/cluster/ring.py
    voicehost/speech/admission.py
    voicehost/tenancy/keys.py
    voicehost/api/auth.py
    voicehost/ids.py
    voicehost/voices/validation.py
)
if (($#)); then modules=("$@"); fi
tests=(
    tests/model/test_orpheus.py tests/model/test_fuzz.py tests/text/test_text.py tests/audio/test_audio_formats.py
    tests/cluster/test_ring.py tests/speech/test_admission.py tests/tenancy/test_keys.py tests/api/test_auth.py
    tests/project/test_ids.py tests/api/test_hostile_uploads.py tests/voices/test_adapter_validation.py
    tests/voices/test_voices.py
)

# The scratch copy: what `git status` shows, without ignored files (.venv, caches, mutants/).
rm -rf "$work"
mkdir -p "$work"
git -C "$repo" ls-files -z --cached --others --exclude-standard \
    | rsync -a --from0 --files-from=- --ignore-missing-args "$repo/" "$work/"

cd "$work"
# mutmut traces every call while it maps tests to functions, which makes hypothesis' timing
# checks (deadlines, "input generation is slow") fail: a plugin switches them off for this run.
cat >mutation_profile.py <<'PY'
"""A pytest plugin of scripts/mutation.sh: hypothesis without deadlines or health checks."""

import hypothesis.core
import hypothesis.internal.conjecture.engine
from hypothesis import settings

settings.register_profile("mutation", deadline=None)
settings.load_profile("mutation")
for module in (hypothesis.core, hypothesis.internal.conjecture.engine):
    module.fail_health_check = lambda *args, **kwargs: None
PY
{
    echo "[mutmut]"
    echo "source_paths = voicehost"
    echo "only_mutate ="
    printf '    %s\n' "${modules[@]}"
    # mutmut copies voicehost/ and tests/ into mutants/; the tests also read the rest.
    echo "also_copy ="
    for entry in * .[!.]*; do
        case $entry in voicehost | tests | mutants | setup.cfg) ;; *) echo "    $entry" ;; esac
    done
    echo "pytest_add_cli_args ="
    printf '    %s\n' -p no:cacheprovider -p mutation_profile
    # The unit tier (no engine, no server: each would start vLLM for every mutant) of the tests
    # of these modules; mutmut then runs, for each mutant, the tests that reached its function.
    echo "pytest_add_cli_args_test_selection ="
    printf '    %s\n' -m unit "${tests[@]}"
} >setup.cfg

"$python" -m mutmut run --max-children "$jobs" >mutmut-run.log 2>&1 || {
    tr '\r' '\n' <mutmut-run.log | tail -40
    exit 1
}

"$python" - "${modules[@]}" <<'EOF'
"""killed/total per mutated module, from mutmut's results in mutants/."""

import json
import sys
from pathlib import Path

# mutmut's exit codes: 0 survived; 5 and 33 no test reached the mutant; any other kills it (a
# failing test, a timeout, a crash: 255 is also an import that failed, e.g. of the conftest).
SURVIVED, NO_TESTS = {0}, {5, 33}
rows, survivors = [], []
for module in sys.argv[1:]:
    meta = Path("mutants") / f"{module}.meta"
    codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    alive = sorted(name for name, code in codes.items() if code in SURVIVED | NO_TESTS)
    survivors += [(name, "no test" if codes[name] in NO_TESTS else "survived") for name in alive]
    rows.append((module, len(codes) - len(alive), len(codes)))
print(f"{'module':36} {'killed':>7} {'total':>6} {'%':>6}")
for module, killed, total in rows:
    print(f"{module:36} {killed:7} {total:6} {100 * killed / max(total, 1):6.1f}")
killed, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
print(f"{'all':36} {killed:7} {total:6} {100 * killed / max(total, 1):6.1f}")
for name, why in survivors:
    print(f"  {why}: {name}")
EOF

# mutmut leaves decorated functions alone, and Admission.admit is a @contextmanager: cosmic-ray
# mutates admission.py whole, in the scratch copy, and runs its unit tests for each mutant.
case " ${modules[*]} " in *" voicehost/speech/admission.py "*) ;; *) exit 0 ;; esac
bin=$(dirname "$python")
if [[ ! -x $bin/cosmic-ray ]]; then
    echo "cosmic-ray is not installed: voicehost/speech/admission.py's admit is not mutated"
    exit 0
fi
cat >cosmic-ray.toml <<TOML
[cosmic-ray]
module-path = "voicehost/speech/admission.py"
timeout = 120.0
excluded-modules = []
test-command = "$python -m pytest -x -q -p no:cacheprovider -m unit tests/speech/test_admission.py"

[cosmic-ray.distributor]
name = "local"

[cosmic-ray.filters.operators-filter]
# "str | None" is only an annotation there (from __future__ import annotations: never evaluated)
exclude-operators = ["core/ReplaceBinaryOperator_BitOr_.*"]
TOML
"$bin/cosmic-ray" init cosmic-ray.toml cosmic-ray.sqlite
"$bin/cr-filter-operators" cosmic-ray.sqlite cosmic-ray.toml
"$bin/cosmic-ray" exec cosmic-ray.toml cosmic-ray.sqlite >cosmic-ray.log 2>&1
"$bin/cosmic-ray" dump cosmic-ray.sqlite >cosmic-ray.jsonl
"$python" - <<'EOF'
"""killed/total of the cosmic-ray run (filtered operators left out), and the survivors."""

import json
from pathlib import Path

results = [json.loads(line) for line in Path("cosmic-ray.jsonl").read_text().splitlines()]
done = [(item, result) for item, result in results if result["worker_outcome"] != "skipped"]
alive = [(item, result) for item, result in done if result["test_outcome"] == "survived"]
killed = len(done) - len(alive)
name = "voicehost/speech/admission.py (cosmic-ray)"
print(f"{name:36} {killed:7} {len(done):6} {100 * killed / max(len(done), 1):6.1f}")
for item, _ in alive:
    (mutation,) = item["mutations"]
    where = f"line {mutation['start_pos'][0]} in {mutation['definition_name']}"
    print(f"  survived: {mutation['operator_name']} {where}")
EOF
