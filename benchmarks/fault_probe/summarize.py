#!/usr/bin/env python3
"""Summarize fault_probe logs: one row per case (survivor view = rank 0 unless noted)."""
import glob, os, re, sys

LINE = re.compile(r'^\[\s*([\d.]+) \| d=\s*([+\-\d.na/ ]+)\] r(\d+) (.*)$')

def parse(path):
    name, cmd, rc, wall, recs, other = os.path.basename(path)[:-4], '', None, None, [], []
    for ln in open(path, errors='replace'):
        ln = ln.rstrip('\n')
        if ln.startswith('=== '):
            cmd = ln.split(': ', 1)[1]; continue
        m = re.match(r'MPIEXEC_EXIT rc=(\d+) wall=([\d.]+)s', ln)
        if m:
            rc, wall = int(m.group(1)), float(m.group(2)); continue
        m = LINE.match(ln)
        if m:
            d = m.group(2).strip()
            recs.append((int(m.group(3)), None if 'n/a' in d else float(d), m.group(4)))
        elif ln.strip():
            other.append(ln.strip())
    return name, cmd, rc, wall, recs, other

def first(recs, rank, prefix):
    for r, d, t in recs:
        if r == rank and t.startswith(prefix):
            return d, t
    return None, None

def short_err(t):
    m = re.search(r'"([^"]*)"', t)
    s = m.group(1) if m else t
    return s[:90]

def res(recs, rank, prefix):
    d, t = first(recs, rank, prefix)
    if t is None:
        return '-'
    if 'TIMEOUT' in t:
        return 'hang(TIMEOUT)'
    if 'ERROR' in t:
        return 'ERR d=%+.2f: %s' % (d, short_err(t))
    if 'completed OK' in t:
        return 'OK(local)' if 'after 0.000' in t else 'OK'
    return t[:60]

def summarize(path):
    name, cmd, rc, wall, recs, other = parse(path)
    ranks = sorted({r for r, _, _ in recs})
    n = max(ranks) + 1 if ranks else 0
    surv = [r for r in ranks if r != n - 1]
    row = {'case': name}
    _, init = first(recs, 0, 'INIT')
    row['size'] = (re.search(r'of (\d+)', init).group(1) if init else '?')
    # a
    _, sm = first(recs, 0, 'A_SMALL'); _, bg = first(recs, 0, 'A_BIG')
    if sm:
        row['a'] = '%s %s' % (re.search(r'(\d+)/1000', sm).group(0), (re.search(r'(\d+)/4', bg).group(0) if bg else 'big:-'))
        if 'ERROR' in sm or 'TIMEOUT' in sm:
            row['a'] += ' ' + sm.split(':')[0]
    else:
        row['a'] = '-'
    # b
    d, t = None, None
    for p in ('B_ERR', 'B_DONE', 'B_TIMEOUT'):
        d, t = first(recs, 0, p)
        if t: break
    row['b_prepost'] = '-' if not t else ('no error in 5 s' if 'B_TIMEOUT' in t else
                       ('ERR d=%+.2f: %s' % (d, short_err(t)) if 'B_ERR' in t else 'DONE(no err) d=%+.2f' % d))
    row['s_send8'] = res(recs, 0, 'S Isend 8 B')
    row['s_send1M'] = res(recs, 0, 'S Isend 1 MiB')
    row['s_recv'] = res(recs, 0, 'S Irecv')
    # c
    _, cc = first(recs, 0, 'C_CREATE'); _, ca = first(recs, 0, 'C_ALLREDUCE result'); _, cb = first(recs, 0, 'C_BARRIER_BLOCKING')
    _, ct = first(recs, 0, 'TIMEOUT after')
    if cc:
        row['c'] = ('create OK' if 'OK' in cc else 'create ' + short_err(cc)) + \
                   (', allreduce ' + ('OK' if ca and ca.endswith('OK') else 'FAIL')) + \
                   (', barrier ' + ('OK' if cb and 'MPI_SUCCESS' in cb else 'FAIL'))
    elif ct and 'Comm_create_group' in ct:
        row['c'] = 'create HANG'
    else:
        row['c'] = '-'
    # x
    xs = [t for r, _, t in recs if r == 0 and t.startswith('X ')]
    row['x'] = '; '.join(x[2:60] for x in xs) if xs else '-'
    # d
    fin = []
    for r in surv:
        _, f = first(recs, r, 'F_FINALIZE returned'); _, to = first(recs, r, 'TIMEOUT after')
        if f:
            fin.append('r%d ok %ss' % (r, re.search(r'after ([\d.]+)', f).group(1)))
        elif to and 'Finalize' in to:
            fin.append('r%d HANG>10s' % r)
        elif to:
            fin.append('r%d hang in %s' % (r, to.split(' in ')[1].split(' (')[0]))
        else:
            last = [t for rr, _, t in recs if rr == r]
            fin.append('r%d gone after "%s"' % (r, last[-1][:40] if last else '?'))
    row['d_finalize'] = ', '.join(fin)
    row['d_rc'] = '%s (%.0fs)' % (rc, wall or 0)
    # e
    sig = {}
    for r, d, t in recs:
        if r in surv and t.startswith('SIGNAL'):
            m = re.search(r'received: (\d+) \(([^)]*)\)', t)
            sig.setdefault(m.group(2), []).append('r%d@%+.2f' % (r, d if d is not None else 0))
    row['e_signals'] = '; '.join('%s: %s' % (k, ' '.join(v)) for k, v in sig.items()) or 'none'
    _, disp = first(recs, 0, 'SIGDISP after MPI_Init: SIGUSR1')
    row['usr1_disp'] = disp.split('-> ')[1] if disp else '-'
    row['mpiexec_says'] = ' | '.join(dict.fromkeys(o[:110] for o in other
                                    if not o.startswith('/') and 'libmpi' not in o))[:400]
    return row, cmd

def main():
    d = sys.argv[1] if len(sys.argv) > 1 else '/tmp/fault_probe_out/logs'
    cols = ['case', 'size', 'a', 'b_prepost', 's_send8', 's_send1M', 's_recv', 'c', 'x', 'd_finalize', 'd_rc', 'e_signals']
    rows = []
    for p in sorted(glob.glob(os.path.join(d, '*.log'))):
        try:
            rows.append(summarize(p))
        except Exception as ex:  # keep going
            rows.append(({'case': os.path.basename(p), 'a': 'PARSE ERROR %r' % ex}, ''))
    for row, cmd in rows:
        print('-' * 100)
        print('%s   [%s]' % (row['case'], cmd))
        for c in cols[1:] + ['usr1_disp', 'mpiexec_says']:
            print('   %-12s %s' % (c, row.get(c, '')))
    print('-' * 100)
    print('\n| case | a: p2p 0<->1 | b: pre-posted recv from dead | send to dead 8B / 1MiB | c: create_group+coll | d: finalize | mpiexec rc | e: signals to survivors |')
    print('|---|---|---|---|---|---|---|---|')
    for row, _ in rows:
        print('| %s | %s | %s | %s / %s | %s | %s | %s | %s |' % (
            row['case'], row.get('a'), row.get('b_prepost'), row.get('s_send8'), row.get('s_send1M'),
            row.get('c'), row.get('d_finalize'), row.get('d_rc'), row.get('e_signals')))

if __name__ == '__main__':
    main()
