"""Course tooling: student-file generation and deck building."""
