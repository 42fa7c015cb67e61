import json,collections,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
prev=None
agg=collections.defaultdict(list)
for r in rows:
    de=r.get('draft_extend') or {}
    kind='plain' if r['width']==1 else r['draft_source']
    if kind=='plain' and prev is not None and de:
        kind += '-deferred' if de['deferred_steps']>prev['deferred_steps'] else '-extend'
    if de and prev and de['catch_up_forwards']>prev['catch_up_forwards']: kind+='+cu'
    agg[(r['bs'],kind)].append((r['step_ms'], r['bs']+sum(r['accepted'])))
    prev=de
for k in sorted(agg):
    v=agg[k]; ms=[x[0] for x in v]; s=sorted(ms)
    print(k,len(v),"mean %.0f median %.0f tok/s %.2f"%(sum(ms)/len(ms), s[len(s)//2], sum(x[1] for x in v)/sum(ms)*1e3))
