#!/bin/bash
# A class graded on a SLURM cluster: a job array of PARTS tasks (grade_part.sbatch, one node
# each), then the merge into the class's grades.csv and report.md, as a job that waits for
# every task (whatever its exit: the merge says which part is missing, if one is).
#
#   bash reference_impl/slurm/grade_class.sh PARTS SUBMISSIONS LABS RESULTS [OPTIONS]
#
# Run it from the kit's root. OPTIONS go to the grader of each part.
set -euo pipefail

if [ "$#" -lt 4 ]; then
    echo "usage: bash grade_class.sh PARTS SUBMISSIONS LABS RESULTS [OPTIONS]" >&2
    exit 2
fi
PARTS=$1
PYTHON=${PYTHON:-python}
HERE=$(dirname "$0")

ARRAY=$(sbatch --parsable --array="0-$((PARTS - 1))" "$HERE/grade_part.sbatch" "${@:2}")
ARRAY=${ARRAY%%;*}                   # --parsable prints "jobid[;cluster]"
MERGE=$(sbatch --parsable --job-name=grade-merge --dependency="afterany:$ARRAY" \
    --ntasks=1 --time=00:10:00 --output=grade-merge-%j.out \
    --wrap="$(printf '%q ' "$PYTHON" -m reference_impl.course.grade.merge "$4")")
echo "submitted the parts as job array $ARRAY and the merge as job ${MERGE%%;*}"
