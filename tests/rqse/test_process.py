"""settle_process: the collector and heap settings of a long-running worker."""

import gc

from rqse.process import settle_process


def test_settling_freezes_start_up_objects_and_widens_the_young_generation() -> None:
    before = gc.get_threshold()
    try:
        settle_process(young_threshold=12_345)
        assert gc.get_threshold()[0] == 12_345
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > 1000  # modules, classes, functions of this process
        assert gc.isenabled()
        assert gc.collect() >= 0  # still collects what is created afterwards
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
