import collections,sys
m={}
for l in open('map2.txt'):
    off,fn,loc=l.split()[:3]; f=loc.split(':')[0]
    m[int(off,16)]=(fn,f)
ev=[l.split() for l in open('trace.txt')]
# file-level tree per thread: collapse consecutive same-file frames; count distinct trees
keep=lambda f: f.startswith('daemon/') or f.startswith('kernels/')
threads=collections.OrderedDict()
for tid,d,e,off in ev:
    threads.setdefault(tid,[]).append((int(d),int(e),m.get(int(off,16),('?','?'))))
files_order=[]; reentry=set(); chains=collections.Counter()
for tid,evs in threads.items():
    stack=[]
    for d,e,(fn,f) in evs:
        if e==1:
            stack.append((fn,f))
            fs=[x[1] for x in stack if keep(x[1])]
            col=[]
            for x in fs:
                if not col or col[-1]!=x: col.append(x)
            chains[(tid,' > '.join(col))]+=1
            if keep(f) and f not in files_order: files_order.append(f)
            if len(col)!=len(set(col)): reentry.add(' > '.join(col))
        else:
            if stack: stack.pop()
print("files entered (daemon/, kernels/), in order:",len(files_order))
for f in files_order: print("  ",f)
print("chains that enter a file twice:",len(reentry))
for r in sorted(reentry)[:20]: print("  ",r)
print("distinct file chains:")
for (tid,c),n in sorted(chains.items(), key=lambda x:x[0]):
    pass
seen=set()
for (tid,c),n in chains.items():
    if c not in seen: seen.add(c)
maxc=sorted(seen,key=lambda c:-c.count('>'))[:15]
for c in maxc: print("  ",c)
