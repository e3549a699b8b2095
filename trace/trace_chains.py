import collections
m={}
for l in open('map2.txt'):
    off,fn,loc=l.split()[:3]; m[int(off,16)]=(fn,loc.split(':')[0])
keep=lambda f: f.startswith('daemon/') or f.startswith('kernels/')
threads=collections.OrderedDict()
for l in open('trace.txt'):
    tid,d,e,off=l.split(); threads.setdefault(tid,[]).append((int(e),m.get(int(off,16),('?','?'))))
for tid,evs in threads.items():
    st=[]; chains=collections.OrderedDict()
    for e,(fn,f) in evs:
        if e:
            st.append(f)
            col=[]
            for x in st:
                if keep(x) and (not col or col[-1]!=x): col.append(x)
            if 'cpu_threads' in ' '.join(col[:-1]): continue
            chains[' > '.join(c.replace('daemon/','').replace('kernels/','') for c in col)]=1
        elif st: st.pop()
    # keep maximal chains only
    cs=list(chains)
    maxi=[c for c in cs if not any(o!=c and o.startswith(c+' > ') for o in cs)]
    print("thread",tid,len(maxi),"maximal chains")
    for c in maxi: print("   ",c)
