"""What a submission leaves running: the tests that start ``sleep MARK`` from a hostile rank
look for it afterwards, each with a mark of its own."""
import subprocess


def sleepers(mark: str) -> list[str]:
    """The process ids of every ``sleep MARK`` still running on this machine."""
    found = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True)
    return found.stdout.split()
