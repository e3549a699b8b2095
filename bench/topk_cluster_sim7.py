# topk_cluster_sim7.py [SEED] [TRIALS] -- host simulation of the slot logic of
# kernels/cuda/topk_cluster.cu after round 7 (bench/RESULTS.md, "Round 7"), from
# round 6's topk_cluster_sim6.py (git show e53b146:bench/topk_cluster_sim6.py; this
# file replaces it): the coarse cluster_find; where the select ends in
# pass 1 (rem_t = 0) each block's count of keys > T from its pass-1 bins >= lo_bin
# and its slots handed out 128 keys a warp from a block cursor, the warps in a
# random order (any order the GPU may take); else the per-warp ballot counts; the
# copy of each block's runs in units of one or two slots (16-byte stores), no
# unit reaching into another block's run; per cluster size and block size,
# against a sort. Experiment, not the product.
import numpy as np, sys
INV=0x007FFFFF; KX=2048
def ord_key(f):
    u=f.view(np.uint32).astype(np.uint64)
    nan=(u & 0x7fffffff) > 0x7f800000
    u=np.where(u==0x80000000,0,u)
    k=np.where(u & 0x80000000, (~u) & 0xffffffff, u | 0x80000000)
    return np.where(nan,0,k).astype(np.uint64)
def find_flat(hist, rem):
    total=int(hist.sum()); above=0
    for d in range(len(hist)-1,-1,-1):
        if above < rem and above + hist[d] >= rem: return d, rem-above, int(hist[d]), total
        above+=int(hist[d])
    return None,None,None,total
def find_coarse(hist, rem, NT):
    NB=len(hist); NG=NB//16
    coarse=hist.reshape(NG,16).sum(1)
    # thread t: group NG-1-t; exclusive scan over threads
    mine=[int(coarse[NG-1-t]) if NG-1-t>=0 else 0 for t in range(NT)]
    above=np.concatenate([[0],np.cumsum(mine)[:-1]]); total=sum(mine)
    res=None
    for t in range(NT):
        if above[t] < rem and above[t]+mine[t] >= rem:
            assert res is None
            gi=NG-1-t; b0=gi*16; c=int(above[t])
            for j in range(15,-1,-1):
                if c+int(hist[b0+j])>=rem:
                    res=(b0+j, rem-c, int(hist[b0+j])); break
                c+=int(hist[b0+j])
            assert res is not None
    return (res if res else (None,None,None))+(total,)
def sim(x,k,cs,NT):
    w=len(x); keys=ord_key(x)
    slice_=max(4,(w+cs-1)//cs); slice_=(slice_+3)&~3
    vis=keys>INV
    def find(h,rem):
        a=find_flat(h,rem); b=find_coarse(h,rem,NT)
        if a[3] >= rem: assert a==b,(a,b)
        else: assert a[3]==b[3]
        return b
    h1=np.bincount((keys[vis]>>20).astype(np.int64),minlength=4096)
    d,rem,cnt,total=find(h1,k)
    lo_bin=None
    if total<=k: T=INV; rem_t=0; G=total; lo_bin=0
    elif cnt-rem<=KX: T=((d<<20)-1) if d else INV; rem_t=0; G=k-rem+cnt; lo_bin=d
    else:
        d1,r1=d,rem; m=vis&((keys>>20)==d1)
        h2=np.bincount(((keys[m]>>8)&4095).astype(np.int64),minlength=4096)
        d,rem,cnt,_=find(h2,r1); p2=d1<<12|d
        if cnt-rem<=KX: T=(p2<<8)-1; rem_t=0; G=k-rem+cnt
        else:
            m=vis&((keys>>8)==p2)
            h3=np.bincount((keys[m]&255).astype(np.int64),minlength=256)
            d,rem,cnt,_=find(h3,rem); T=p2<<8|d; rem_t=rem; G=k-rem_t
    n_list=G+rem_t
    lists=[[None]*(k+KX) for _ in range(cs)]
    NW=NT//32
    bases_gt=[0]*cs; bases_eq=[0]*cs; blk=[]
    for q in range(cs):
        b=q*slice_; nn=max(0,min(slice_,w-b))
        wc=(nn+32*NW-1)//(32*NW)*32
        wg=[];we=[]
        for wi in range(NW):
            w0=min(wi*wc,nn); w1=min(w0+wc,nn); g=e=0
            for i0 in range(w0,w1,32):
                for l in range(32):
                    kk=int(keys[b+i0+l]) if i0+l<w1 else 0
                    g+=kk>T; e+=kk==T
            wg.append(g); we.append(e)
        if lo_bin is not None:
            kb=keys[b:b+nn]; hb_=np.bincount((kb[kb>INV]>>20).astype(np.int64),minlength=4096)
            bg=int(hb_[lo_bin:].sum()); assert bg==sum(wg)
            blk.append((None,None,bg,0))
        else: blk.append((wg,we,sum(wg),sum(we)))
    for q in range(cs):
        for qq in range(q+1,cs): bases_gt[qq]+=blk[q][2]; bases_eq[qq]+=blk[q][3]
    for q in range(cs):
        b=q*slice_; nn=max(0,min(slice_,w-b))
        wc=(nn+32*NW-1)//(32*NW)*32
        wg,we,bgt,beq=blk[q]; gt0=bases_gt[q]; eq0=bases_eq[q]
        L=lists[q]
        if lo_bin is not None:
            # warps' 128-key iterations in a random interleaving, each taking its
            # slots from the block's cursor
            its=[(wi,i00) for wi in range(NW) for i00 in range(min(wi*wc,nn),min(min(wi*wc,nn)+wc,nn),128)]
            rng.shuffle(its); cur=0
            for wi,i00 in its:
                w0=min(wi*wc,nn); w1=min(w0+wc,nn)
                ks=[int(keys[b+i]) if i<w1 else 0 for i in range(i00,i00+128)]
                n_=sum(1 for kk in ks if kk>T); at=gt0+cur; cur+=n_
                for j,kk in enumerate(ks):
                    if kk>T: assert L[at] is None; L[at]=(kk<<32)|(0xFFFFFFFF-(b+i00+j)); at+=1
            assert cur==bgt
        for wi in range(NW if lo_bin is None else 0):
            w0=min(wi*wc,nn); w1=min(w0+wc,nn)
            gt_at=gt0+sum(wg[:wi]); eq_at=eq0+sum(we[:wi])
            for i0 in range(w0,w1,32):
                ks=[int(keys[b+i0+l]) if i0+l<w1 else 0 for l in range(32)]
                mg=[kk>T for kk in ks]; me=[kk==T for kk in ks]
                for l in range(32):
                    kk=ks[l]
                    if kk>T:
                        sl=gt_at+sum(mg[:l]); assert L[sl] is None; L[sl]=(kk<<32)|(0xFFFFFFFF-(b+i0+l))
                    elif kk==T:
                        e=eq_at+sum(me[:l])
                        if e<rem_t: assert L[G+e] is None; L[G+e]=(kk<<32)|(0xFFFFFFFF-(b+i0+l))
                gt_at+=sum(mg); eq_at+=sum(me)
        e0=min(eq0,rem_t); e1=min(eq0+beq,rem_t)
        def run(s0,s1):
            head=1 if (s0&1) and s0<s1 else 0; n_=s1-s0-head
            return s0,s1,head,n_//2,head+n_//2+(n_&1)
        def unit(r,j):
            s0,s1,head,pairs,_=r
            if j<head: return [s0]
            if j-head<pairs: sl=s0+head+2*(j-head); assert sl%2==0; return [sl,sl+1]
            return [s1-1]
        rg=run(gt0,gt0+bgt); re_=run(G+e0,G+e1); mine=rg[4]+re_[4]
        for t in range(mine*(cs-1)):
            o=t//mine; j=t-o*mine
            sl=unit(rg,j) if j<rg[4] else unit(re_,j-rg[4])
            dst=(q+1+o)%cs
            for slot in sl:
                assert gt0<=slot<gt0+bgt or G+e0<=slot<G+e1
                assert L[slot] is not None
                assert lists[dst][slot] is None or lists[dst][slot]==L[slot]
                lists[dst][slot]=L[slot]
    for q in range(cs):
        assert all(v is not None for v in lists[q][:n_list]),(q,)
        assert lists[q][:n_list]==lists[0][:n_list]
    lst=lists[0][:n_list]
    # the list: keys > T in position order, then keys == T in position order
    gts=sorted([i for i in range(w) if keys[i]>T]); got=[0xFFFFFFFF-(c&0xFFFFFFFF) for c in lst[:G]]
    assert (sorted(got) if lo_bin is not None else got)==gts
    eqs=sorted([i for i in range(w) if keys[i]==T])[:rem_t]; assert [0xFFFFFFFF-(c&0xFFFFFFFF) for c in lst[G:]]==eqs
    # rank as the kernel: buckets by 12 bits below the shared bits (OR/AND of keys > T)
    kor=0;kand=0xFFFFFFFF
    for c in lst[:G]: kor|=c>>32; kand&=c>>32
    diff=kor^kand; hb=diff.bit_length()-1 if diff else 0; sh=hb-11 if hb>11 else 0
    bk=lambda c: ((c>>32)>>sh)&4095
    cnts=[0]*4096
    for c in lst[:G]: cnts[bk(c)]+=1
    start=[0]*4096; at=0
    for bb in range(4095,-1,-1): start[bb]=at; at+=cnts[bb]
    buckets={}
    for c in lst[:G]: buckets.setdefault(bk(c),[]).append(c)
    pos=[-1]*k
    for i in range(G):
        c=lst[i]; bb=bk(c); rank=start[bb]+sum(1 for y in buckets[bb] if y>c)
        if rank>=k: continue
        assert pos[rank]==-1; pos[rank]=0xFFFFFFFF-(c&0xFFFFFFFF)
    for i in range(G,n_list): pos[i]=0xFFFFFFFF-(lst[i]&0xFFFFFFFF)
    return pos,min(k,n_list)
def ref(x,k):
    idx=[i for i in range(len(x)) if not np.isnan(x[i]) and x[i]!=-np.inf]
    idx.sort(key=lambda i:(-float(x[i]),i)); idx=idx[:k]
    return idx+[-1]*(k-len(idx)), len(idx)
rng=np.random.default_rng(int(sys.argv[1]) if len(sys.argv)>1 else 1)
n=0
for trial in range(int(sys.argv[2]) if len(sys.argv)>2 else 24):
    w=int(rng.integers(1,5000)); kind=trial%9
    if kind==0: x=rng.standard_normal(w).astype(np.float32)
    elif kind==1: x=(rng.integers(-64,65,w)/8).astype(np.float32)
    elif kind==2: x=np.full(w,1.5,np.float32)
    elif kind==3: x=np.ones(w,np.float32); x[rng.integers(0,w,min(w,300))]=3.0
    elif kind==4: x=np.ones(w,np.float32); n2=min(w,700); x[:n2]=2.0+np.arange(n2,dtype=np.float32)/524288
    elif kind==5: x=np.full(w,2.0,np.float32); n2=min(w,500); x[:n2]=np.float32(2.0+1/1024)+(np.arange(n2)%2).astype(np.float32)/4194304
    elif kind==6: x=np.full(w,-np.inf,np.float32); x[rng.integers(0,w,5)]=rng.integers(-8,9,5)
    elif kind==7: x=(rng.integers(-64,65,w)/8).astype(np.float32); x[::5]=np.nan; x[1::7]=np.where(np.arange(len(x[1::7]))%2,-0.0,0.0)
    else: x=(-3.3e38+rng.integers(0,50,w)*1e36).astype(np.float32)  # bin 0 of pass 1
    for k in (1,int(rng.integers(1,900)),700,4096):
        for cs in (1,2,4,16):
            for NT in (512,1024):
                p,c=sim(x,k,cs,NT); rp,rc=ref(x,k)
                if p!=rp or c!=rc:
                    print("MISMATCH kind",kind,"w",w,"k",k,"cs",cs,"NT",NT,c,rc); sys.exit(1)
                n+=1
print("ok",n)
