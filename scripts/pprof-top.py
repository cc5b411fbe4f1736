# Flat and cumulative top of a Go pprof CPU profile (gzipped profile.proto), without Go:
# python3 scripts/pprof-top.py PROFILE.pb.gz [FLAT_ROWS] [CUM_ROWS]. Used for etcd's own profile
# (etcd --enable-pprof; /debug/pprof/profile?seconds=N on its client URL), in
# docs/benchmarks/grpc-cpu.md.
import gzip, sys, collections
def varint(b, i):
    r = s = 0
    while True:
        c = b[i]; i += 1; r |= (c & 0x7f) << s; s += 7
        if c < 0x80: return r, i
def fields(b):
    i = 0
    while i < len(b):
        k, i = varint(b, i); f, t = k >> 3, k & 7
        if t == 0: v, i = varint(b, i)
        elif t == 2:
            n, i = varint(b, i); v = b[i:i+n]; i += n
        elif t == 1: v = b[i:i+8]; i += 8
        elif t == 5: v = b[i:i+4]; i += 4
        yield f, t, v
def packed(t, v):
    if t == 0: return [v]
    out=[]; i=0
    while i < len(v):
        x, i = varint(v, i); out.append(x)
    return out
b = gzip.decompress(open(sys.argv[1],'rb').read())
strings=[]; samples=[]; locs={}; funcs={}
for f,t,v in fields(b):
    if f==6: strings.append(v.decode(errors='replace'))
    elif f==2:
        ls=[]; vals=[]
        for g,u,w in fields(v):
            if g==1: ls+=packed(u,w)
            elif g==2: vals+=packed(u,w)
        samples.append((ls,vals))
    elif f==4:
        lid=0; fl=[]
        for g,u,w in fields(v):
            if g==1: lid=w
            elif g==4:
                for h,x,y in fields(w):
                    if h==1: fl.append(y)
        locs[lid]=fl
    elif f==5:
        fid=0; name=0
        for g,u,w in fields(v):
            if g==1: fid=w
            elif g==2: name=w
        funcs[fid]=name
def names(l): return [strings[funcs[f]] for f in locs[l]]
flat=collections.Counter(); cum=collections.Counter(); total=0
for ls,vals in samples:
    v=vals[1] if len(vals)>1 else vals[0]; total+=v
    if ls: flat[names(ls[0])[0]]+=v
    seen=set()
    for l in ls:
        for n in names(l):
            if n not in seen: seen.add(n); cum[n]+=v
print("total ms", total/1e6)
print("--flat"); [print(f"{v/total*100:5.1f}% {n}") for n,v in flat.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 25)]
print("--cum"); [print(f"{v/total*100:5.1f}% {n}") for n,v in cum.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 45)]
