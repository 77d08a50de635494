"""A stand-in for alphajudge (AlphaPulldownSnakemake's structure analysis; tests only), run in
the analysis container: one prediction folder gives its interfaces.csv, ``--recursive
--summary FILE`` gathers them all into one CSV.

    python3 alphajudge.py PREDICTION_DIR [--contact_thresh=8.0 ...]
    python3 alphajudge.py PREDICTIONS_DIR --recursive --summary FILE
"""

import csv
import glob
import json
import os
import sys

folder, options = sys.argv[1], sys.argv[2:]
if "--recursive" in options:
    summary = options[options.index("--summary") + 1]
    os.makedirs(os.path.dirname(summary), exist_ok=True)
    with open(summary, "w", newline="") as stream:
        out = csv.writer(stream)
        out.writerow(["fold", "bucket", "score"])
        for path in sorted(glob.glob(os.path.join(folder, "*", "interfaces.csv"))):
            with open(path) as row:
                out.writerows(list(csv.reader(row))[1:])
else:
    with open(os.path.join(folder, "ranking_debug.json")) as stream:
        ranking = json.load(stream)
    with open(os.path.join(folder, "interfaces.csv"), "w", newline="") as stream:
        out = csv.writer(stream)
        out.writerow(["fold", "bucket", "score"])
        out.writerow([ranking["fold"], ranking["bucket"], ranking["score"]])
