"""dist.empty / dist.zeros at world size 1: argument errors (function, argument, rule, what was given),
what they return, the heap's bookkeeping, and all_reduce(algorithm="shm") of one rank."""
import numpy as np
import pytest

import pydist as dist
from pydist import _C


@pytest.mark.parametrize("fn", [dist.empty, dist.zeros])
def test_shape_and_dtype_are_checked(fn):
    name = fn.__name__
    with pytest.raises(ValueError, match=rf"{name}\(\): `shape` must hold non-negative sizes; got -1 at index 1"):
        fn((3, -1))
    with pytest.raises(TypeError, match=rf"{name}\(\): `shape` must hold ints; got float at index 0"):
        fn((2.5,))
    with pytest.raises(TypeError, match=rf"{name}\(\): `shape` must be an int or a tuple of ints; got str"):
        fn("3")
    with pytest.raises(TypeError, match=rf"{name}\(\): `shape` must be an int or a tuple of ints; got bool"):
        fn(True)
    with pytest.raises(TypeError, match=rf"{name}\(\): `dtype` must be one pydist moves .*got dtype\('O'\)"):
        fn(3, object)
    with pytest.raises(TypeError, match=rf"{name}\(\): `dtype` must be one pydist moves .*got dtype\('>f4'\)"):
        fn(3, ">f4")
    with pytest.raises(TypeError, match=rf"{name}\(\): `dtype` must be one pydist moves .*longdouble|float128"):
        fn(3, np.longdouble)
    with pytest.raises(TypeError):
        fn(3, "no such dtype")
    with pytest.raises(ValueError, match=rf"{name}\(\): `shape` is too large to allocate"):
        fn((1 << 40, 1 << 40))
    with pytest.raises(TypeError, match=rf"{name}\(\): `group` must be a ProcessGroup"):
        fn(3, group="world")


def test_too_large_for_the_segment_is_a_memory_error():
    region = _C.shm_info()["region_bytes"]
    with pytest.raises(MemoryError, match=r"empty\(\): .* do not fit in this rank's shared segment .*PYDIST_SHM_BYTES"):
        dist.empty(region + 1, np.uint8)


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint64", "float16", "float32", "float64", "complex128"])
def test_returns_aligned_writable_arrays_in_the_segment(dtype):
    z = dist.zeros((3, 5), dtype)
    e = dist.empty(7, dtype)
    assert z.dtype == np.dtype(dtype) and z.shape == (3, 5) and np.all(z == 0)
    assert e.shape == (7,) and e.flags.c_contiguous and e.flags.writeable and e.flags.aligned
    assert z.ctypes.data % 64 == 0 and type(z.base).__name__ == "ShmBlock"
    assert dist.empty(4).dtype == np.float32 and dist.zeros(()).shape == ()
    assert dist.zeros(0).size == 0


def test_blocks_return_to_the_heap_and_arrays_outlive_the_group(restore_group):
    before = _C.shm_info()["heap_used"]
    a = dist.zeros(10_000)
    view = a[100:200]
    del a
    assert _C.shm_info()["heap_used"] > before   # the view keeps the block
    del view
    assert _C.shm_info()["heap_used"] == before
    keep = dist.zeros(1000, np.int64)
    dist.destroy_process_group()
    keep += 5   # the mapping lives on with the array
    assert np.all(keep == 5)
    with pytest.raises(ValueError, match=r"empty\(\): the default process group has not been initialized"):
        dist.empty(3)
    dist.init_process_group(backend="mpi")
    dist.all_reduce(keep, algorithm="shm")
    assert np.all(keep == 5)
    del keep


def test_all_reduce_shm_alone():
    x = dist.zeros(5)
    x[:] = 2
    dist.all_reduce(x, op=dist.ReduceOp.AVG, algorithm="shm")
    w = dist.all_reduce(np.ones(3), algorithm="shm", async_op=True)
    assert np.all(x == 2) and w.is_completed() and w.wait() is True
