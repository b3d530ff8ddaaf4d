"""Process exit codes, the contract with scripts and CI (documented in the README)."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a check or an operation failed on some host
    USAGE = 2  # bad command line or bad inventory; nothing was done
    INTERRUPTED = 130  # SIGINT
