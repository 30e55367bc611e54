"""placeholder"""


def add_bench_args(p):
    pass


def main(args):
    raise NotImplementedError
