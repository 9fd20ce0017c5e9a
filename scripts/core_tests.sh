# The core tests that the stages on other Pythons and other MPI libraries run (sourced by
# scripts/test_pythons.sh, test_pip_install.sh, test_libraries.sh and test_stages.sh's py314 stage):
#   CORE_UNIT  the unit files that reach every C API entry (world size 1)
#   CORE_MPI   the multi-rank files: every collective, p2p, async, groups, errors, objects, the slots,
#              the engine's data parallelism, threads on every path, and every path a path table forces
#   NO_TORCH   a -k filter that leaves out the tests needing torch (installed for .venv's Python only)
CORE_UNIT=(tests/unit/test_api.py tests/unit/test_errors.py tests/unit/test_float16.py tests/unit/test_gil.py
           tests/unit/test_memory.py tests/unit/test_engine.py)
CORE_MPI=(tests/mpi/test_all_reduce.py tests/mpi/test_collectives.py tests/mpi/test_broadcast_barrier.py
          tests/mpi/test_p2p.py tests/mpi/test_async.py tests/mpi/test_groups.py tests/mpi/test_errors_mpi.py
          tests/mpi/test_objects_batch.py tests/mpi/test_shm_small.py tests/mpi/test_engine_dp.py
          tests/mpi/test_threads.py tests/mpi/test_path_table.py)
NO_TORCH="not (torch_tensor or torch_parameter or torch_bfloat16 or torch_non_contiguous or torch_float16 or ml_dtypes)"
