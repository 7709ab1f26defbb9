"""The bundle's entry point (``run_autograder`` runs it; ``setup.sh`` runs it with ``--check``).

Only the standard library until the course package is imported, so an image whose installation failed still
writes a results.json that says so (every test failed with the reason, a non-zero exit) instead of none at all.
Gradescope runs this file as a script, without ``dtlabs``: once the package imports, ``cli.exit_code`` turns the
autograder's ``Status`` into the exit code, as ``dtlabs`` would; before, ``NOT_GRADED`` is that code's value.
"""
import json
import os
import sys
import traceback

ROOT = os.environ.get("DTLABS_AUTOGRADER_ROOT", "/autograder")
NOT_GRADED = 1  # cli.ExitCode.INCOMPLETE, which cannot be imported where the package does not import


def _cannot_import(exc):
    with open(os.path.join(ROOT, "source", "dtlabs-autograder.json")) as fh:
        manifest = json.load(fh)
    why = ("NOT GRADED: the autograder's environment cannot grade (the course package does not import: "
           f"{type(exc).__name__}: {exc}); this is not your fault, and the instructor has been told.")
    tests = [{"name": t["name"], "score": 0.0, "max_score": t["points"], "status": "failed", "output": why,
              "visibility": "visible"} for t in manifest["tests"]]
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "results.json"), "w") as fh:
        json.dump({"score": 0.0, "output": why, "stdout_visibility": "hidden", "tests": tests}, fh, indent=1)
    traceback.print_exc()
    print("ENVIRONMENT ERROR: rebuild the autograder (see setup.sh's log on Gradescope)")
    return NOT_GRADED


def main():
    try:
        from lab_utils.cli import exit_code
        from lab_utils.grading.export import autograder
    except Exception as exc:  # noqa: BLE001 - whatever broke the installation, results.json says so
        if "--check" in sys.argv:
            traceback.print_exc()
            return NOT_GRADED
        return _cannot_import(exc)
    return exit_code(autograder.main(ROOT, check_only="--check" in sys.argv))


if __name__ == "__main__":
    sys.exit(main())
