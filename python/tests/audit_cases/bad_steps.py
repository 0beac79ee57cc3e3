"""Steps the audit cannot run: each is exit 2 with one line."""

NOT_A_FUNCTION = 3


def returns_a_number():
    return 42


def maker_raises():
    raise RuntimeError("no data directory")


def step_raises():
    def step(i):
        if i == 1:
            raise ValueError("batch 1 is missing")  # RAISE_LINE

    return step
