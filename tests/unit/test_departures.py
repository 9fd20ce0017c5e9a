"""A rank that leaves ends only the waits that need it; an init that times out leaves nothing half made.

Real jobs under mpiexec (test_faults.py's run_job): each rank writes what it saw with report(), and
the test reads every rank's file.
"""
from test_faults import reports, run_job


def test_departure_ends_only_the_waits_that_need_the_rank(tmp_path):
    """Rank 2's script ends while ranks 0 and 1 are still working. Their own traffic (point-to-point
    between them, collectives on a group without rank 2) goes on long after the 2 s grace; a
    collective on the world, which needs rank 2, fails naming it; so does a receive from anyone on
    the world (rank 2 might have been the sender)."""
    proc, _ = run_job(tmp_path, 3, """
        dist.init_process_group()
        r = dist.get_rank()
        pair = dist.new_group([0, 1])
        dist.barrier()
        if r == 2:
            report("LEAVING")
            sys.exit(0)
        time.sleep(0.5)
        x = np.zeros(4)
        # 0 waits in recv for 3 s after rank 2 left: longer than the grace, and it must still complete
        if r == 0:
            src = dist.recv(x, src=1)
            report(f"RECV {src} {x.tolist()}")
        else:
            time.sleep(3.0)
            dist.send(np.arange(4.0), dst=0)
        # a collective of the pair, with rank 1 late by 3 s: rank 2 is not needed
        y = np.full(2, float(r + 1))
        if r == 1:
            time.sleep(3.0)
        dist.all_reduce(y, group=pair)
        report(f"PAIR {y.tolist()}")
        # rank 0 receives from anyone in the pair group, rank 1 sends late: fine, rank 2 is not in it
        if r == 0:
            src = dist.recv(x, src=None, group=pair)
            report(f"ANY IN PAIR {src}")
        else:
            time.sleep(2.5)
            dist.send(np.ones(4), dst=0, group=pair)
        # a world collective needs rank 2: it fails, naming it
        try:
            dist.all_reduce(np.zeros(1))
            report("WORLD COMPLETED")
        except dist.DistError as e:
            report(f"WORLD ERROR {e}")
        if r == 0:
            try:
                dist.recv(x)   # from anyone in the world: rank 2 could have been the sender
                report("ANY COMPLETED")
            except dist.DistError as e:
                report(f"ANY ERROR {e}")
        dist.barrier(group=pair)
        os._exit(0)   # the failed world collective stays pending: skip the orderly shutdown
    """, timeout=90)
    assert reports(tmp_path, 2) == ["LEAVING"], proc.stderr
    r0, r1 = reports(tmp_path, 0), reports(tmp_path, 1)
    assert r0[:3] == ["RECV 1 [0.0, 1.0, 2.0, 3.0]", "PAIR [3.0, 3.0]", "ANY IN PAIR 1"], (r0, proc.stderr)
    assert r1[:1] == ["PAIR [3.0, 3.0]"], (r1, proc.stderr)
    for lines in (r0, r1):
        world = [l for l in lines if l.startswith("WORLD")]
        assert len(world) == 1 and world[0].startswith("WORLD ERROR"), lines
        assert "all_reduce cannot complete: rank 2 has exited" in world[0], world
    any_line = [l for l in r0 if l.startswith(("ANY ERROR", "ANY COMPLETED"))]
    assert len(any_line) == 1 and "recv cannot complete: rank 2 has exited" in any_line[0], r0


def test_init_timeout_leaves_nothing_half_made(tmp_path):
    """Rank 1 comes to init 5 s late; rank 0's init(timeout=1) fails with DistTimeoutError, its pending
    communicator duplications stay parked (MPI may still complete them; their handles are not on a
    dead stack), and a second init in that process refuses clearly instead of matching the wrong
    operations. When rank 1 arrives, its init completes against rank 0's parked operations, and goes
    on without the path table, whose broadcast (every rank's, after the duplications) rank 0 never
    joined: within rank 1's own timeout, saying so.

    MPI is started by mpi4py first (MPI_Init waits for every process, so only an MPI that is already
    running lets init_process_group's own rendezvous time out), which also checks that pydist adopts
    an MPI started by someone else and reads its thread level."""
    proc, _ = run_job(tmp_path, 2, """
        from mpi4py import MPI
        import pydist._C as C
        r = MPI.COMM_WORLD.Get_rank()
        out = lambda msg: open(os.path.join(os.environ["JOB_OUT"], f"rank{r}.txt"), "a").write(msg + chr(10))
        if r == 0:
            t = time.monotonic()
            try:
                dist.init_process_group(timeout=1.0)
                out("INIT OK")
            except dist.DistTimeoutError as e:
                out(f"TIMEOUT {time.monotonic() - t:.1f} {e}")
            out(f"PARKED {C.parked()}")
            try:
                dist.init_process_group(timeout=1.0)
                out("SECOND INIT OK")
            except dist.DistError as e:
                out(f"SECOND {type(e).__name__}: {e}")
            # Rank 1's init completes against the parked duplications meanwhile; MPICH moves them
            # only while this process calls into MPI, so keep its progress engine turning.
            end = time.monotonic() + 20
            while time.monotonic() < end and not os.path.exists(os.path.join(os.environ["JOB_OUT"], "rank1.txt")):
                MPI.COMM_WORLD.Iprobe()
                time.sleep(0.01)
            time.sleep(0.5)
        else:
            time.sleep(5.0)
            t = time.monotonic()
            try:
                dist.init_process_group(timeout=4.0)
                out(f"INIT {dist.get_rank()} {dist.get_world_size()} {C.mpi_info()['thread_level']}")
            except dist.DistTimeoutError as e:
                out(f"TIMEOUT {time.monotonic() - t:.1f} {e}")
        os._exit(0)
    """, timeout=60, env_extra={"PYDIST_SHM_BYTES": "0"})
    # PYDIST_SHM_BYTES=0: init's shared-memory set-up is one more collective after the duplications,
    # which rank 1 cannot complete against a rank 0 that gave up (it would wait for its own timeout,
    # then go on without a segment); without it init is only the duplications, as this test needs.
    r0 = reports(tmp_path, 0)
    assert len(r0) == 3, (r0, proc.stderr)
    assert r0[0].startswith("TIMEOUT ") and "init_process_group timed out" in r0[0], r0
    assert float(r0[0].split()[1]) >= 1.0, r0
    assert r0[1] == "PARKED 3", r0    # the world's dup, its private one and the liveness channel's
    assert r0[2].startswith("SECOND DistError") and "earlier init_process_group did not complete" in r0[2], r0
    # Rank 1's duplications complete against rank 0's parked ones, but init's agreement (every rank learns
    # whether any rank failed a step of its own) needs rank 0, which gave up: rank 1 raises the same error
    # as rank 0 did, within its one timeout (init's steps share one deadline).
    r1 = reports(tmp_path, 1)
    assert len(r1) == 1 and r1[0].startswith("TIMEOUT ") and "init_process_group timed out" in r1[0], (r1, proc.stderr)
    assert 3.5 <= float(r1[0].split()[1]) < 8.0, r1


def test_departure_ends_a_shared_memory_all_reduce(tmp_path):
    """Rank 1's script ends while rank 0 waits in an all_reduce(algorithm="shm") that needs it: rank 0's
    spin on the shared counters runs the departed-rank check too, and fails naming rank 1 (after the
    grace), instead of waiting forever."""
    proc, _ = run_job(tmp_path, 2, """
        dist.init_process_group()
        r = dist.get_rank()
        x = dist.zeros(1000)
        dist.all_reduce(x, algorithm="shm")   # the channel exists on both ranks
        dist.barrier()
        if r == 1:
            report("LEAVING")
            sys.exit(0)
        t = time.monotonic()
        try:
            dist.all_reduce(x, algorithm="shm")
            report("COMPLETED")
        except dist.DistError as e:
            report(f"ERROR {time.monotonic() - t:.1f} {e}")
        os._exit(0)
    """, timeout=90)
    assert reports(tmp_path, 1) == ["LEAVING"], proc.stderr
    r0 = reports(tmp_path, 0)
    assert len(r0) == 1 and r0[0].startswith("ERROR"), (r0, proc.stderr)
    assert "all_reduce cannot complete: rank 1 has exited" in r0[0] and 1.5 < float(r0[0].split()[1]) < 30, r0
