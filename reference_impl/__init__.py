"""Reference implementation of the course: every parallel component, tested against a
single-device model. Each idea lives in one module; see the README's course map."""
