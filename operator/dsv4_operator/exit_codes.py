"""What each `dsv4` command's exit codes mean: one table for --help, docs/cli.md and README.

Other tools (CI jobs, `helm test`) call `dsv4` and branch on its exit code, so these are a
contract. Each command's `--help` ends with its codes (`exit_codes_help`), and tools/gen_docs.py
writes the same table into docs/cli.md and README.md.
"""

from __future__ import annotations

from dsv4_operator.yaml_input import MAX_ALIASES, MAX_BYTES, MAX_DEPTH, MAX_INTEGER_DIGITS

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2
EXIT_CHECK_FAILED = 1  # `dsv4 selftest`: a check of the installation failed
EXIT_LEAKING = 1  # `dsv4 probe`: a leak rate significantly above the threshold
EXIT_INCONCLUSIVE = 3  # `dsv4 probe`: neither significantly above nor below the threshold
EXIT_NOT_REPRODUCED = 1  # `dsv4 bisect`: the rejected configuration did not fail (no culprit)

_UNUSABLE_FILE = (
    "FILE unreadable, not UTF-8 or not YAML (a control character such as NUL, a syntax error), "
    f"larger than {MAX_BYTES // 2**20} MiB, nested deeper than {MAX_DEPTH} levels, with more "
    f"than {MAX_ALIASES} aliases (an alias bomb) or an integer of more than "
    f"{MAX_INTEGER_DIGITS:,} digits"
)

ExitCodes = tuple[tuple[int, str], ...]

#: Per command, each code and what it means. `dsv4 run` has none: it serves until stopped.
EXIT_CODES: dict[str, ExitCodes] = {
    "validate": (
        (EXIT_OK, "no error finding"),
        (
            EXIT_FINDINGS,
            "an error finding (schema errors are findings with rule `schema` and the field path)",
        ),
        (
            EXIT_BAD_INPUT,
            f"{_UNUSABLE_FILE}; or a document that is not a `dsv4.io/v1alpha1` "
            "`DSV4Deployment` (the other documents are still reported; the worst document "
            "decides)",
        ),
    ),
    "plan": (
        (EXIT_OK, "every document planned, valid, and every role fits"),
        (
            EXIT_FINDINGS,
            "a document is invalid (an error finding, as for `validate`) or cannot be planned, "
            "or a role does not fit (a `does not fit` finding, rule DSV4-R008); every "
            "document's plan and findings are still printed",
        ),
        (EXIT_BAD_INPUT, "as for `validate`"),
    ),
    "render": (
        (EXIT_OK, "every child manifest written"),
        (EXIT_FINDINGS, "a spec is invalid (nothing rendered)"),
        (
            EXIT_BAD_INPUT,
            f"{_UNUSABLE_FILE}; or a document that is not a DSV4Deployment (nothing rendered)",
        ),
    ),
    "crd": ((EXIT_OK, "the CRD written"),),
    "rules": ((EXIT_OK, "the catalogue written"),),
    "probe": (
        (
            EXIT_OK,
            "CLEAN: every endpoint's leak rate is significantly below the threshold "
            "(the Wilson upper bound at --confidence is under it)",
        ),
        (
            EXIT_LEAKING,
            "LEAKING: an endpoint's leak rate is significantly above the threshold "
            "(the Wilson lower bound at --confidence is over it)",
        ),
        (
            EXIT_BAD_INPUT,
            "a bad URL or option, the canary could not run, or no response could be classified",
        ),
        (
            EXIT_INCONCLUSIVE,
            "INCONCLUSIVE: no endpoint is leaking, but one's leak rate is neither significantly "
            "above nor below the threshold (more sessions would tell)",
        ),
    ),
    "bisect": (
        (
            EXIT_OK,
            "a dry run printed the units and the probe plan; or the search found the culprit "
            "settings and confirmed them (they failed on two probes)",
        ),
        (
            EXIT_NOT_REPRODUCED,
            "no culprit: the rejected configuration, or its smallest failing part, did not "
            "fail again (not reproduced), or the two specs run the same engines",
        ),
        (
            EXIT_BAD_INPUT,
            "an unreadable file, not exactly one DSV4Deployment in it, or an invalid spec "
            "(the field is named)",
        ),
        (
            EXIT_INCONCLUSIVE,
            "no culprit yet: the probe budget ran out, or the probes that would decide were "
            "inconclusive or refused by the rules (a larger budget, or more responses per probe, "
            "would tell), or the good spec failed its control probe too (the leak is not the "
            "delta's)",
        ),
    ),
    "selftest": (
        (EXIT_OK, "every check passed"),
        (EXIT_CHECK_FAILED, "a check failed (each is printed with a reason)"),
    ),
    "tap": (
        (
            EXIT_BAD_INPUT,
            "a bad `--upstream`, `--listen` or `--metrics`, or a worker that cannot start "
            "(otherwise the tap serves until it is stopped)",
        ),
    ),
}

#: What every command does on a usage error (click's own code).
USAGE_ERROR = "A usage error (an unknown option, a missing `-f`) exits 2 for every command."


def exit_codes_help(command: str) -> str:
    """The closing paragraphs of `dsv4 COMMAND --help`: one per exit code, as EXIT_CODES says."""
    return "\n\n".join(f"Exit {code}: {meaning}." for code, meaning in EXIT_CODES[command])


def with_exit_codes(command: str, summary: str) -> str:
    """A command's help text: its summary, then its exit codes."""
    return f"{summary}\n\n{exit_codes_help(command)}"
