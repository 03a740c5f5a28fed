"""Inline CSS and JavaScript for the HTML reports (no CDN, no network: everything ships in the file)."""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import os
from pathlib import Path

CSS = """
:root{--fg:#1d2330;--muted:#5b6475;--line:#d9dde5;--bg:#fff;--soft:#f5f7fa;--crit:#b42318;--warn:#b54708;--info:#175cd3;--ok:#067647}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);background:var(--bg);margin:0}
header.tk-head{padding:18px 28px 10px;border-bottom:1px solid var(--line);background:var(--soft)}
header.tk-head h1{margin:0 0 4px;font-size:22px}
header.tk-head .meta{color:var(--muted);font-size:13px}
nav.tk-nav{position:sticky;top:0;z-index:5;background:#fff;border-bottom:1px solid var(--line);padding:6px 28px;font-size:13px;display:flex;flex-wrap:wrap;gap:2px 14px}
nav.tk-nav a{color:var(--info);text-decoration:none;white-space:nowrap}
main{padding:8px 28px 40px;max-width:1400px}
section{margin:22px 0 30px}
section h2{font-size:18px;border-bottom:1px solid var(--line);padding-bottom:4px;margin-bottom:10px}
section h3{font-size:15px;margin:16px 0 6px}
.na{color:var(--muted);font-style:italic}
.note{color:var(--muted);font-size:13px}
.verdict{font-size:17px;padding:12px 16px;border-left:5px solid var(--info);background:var(--soft);margin-bottom:12px}
.verdict.communication{border-color:var(--crit)} .verdict.compute{border-color:var(--ok)} .verdict.idle{border-color:var(--warn)}
ol.fixes li{margin:6px 0}
.sev{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600;color:#fff}
.sev.critical{background:var(--crit)} .sev.warning{background:var(--warn)} .sev.info{background:var(--info)}
.saving{font-weight:600;color:var(--ok)}
.tbl-wrap{max-height:560px;overflow:auto;border:1px solid var(--line);border-radius:4px}
table.tk{border-collapse:collapse;width:100%;font-size:13px}
table.tk th,table.tk td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
table.tk td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.tk thead th{position:sticky;top:0;background:var(--soft);z-index:1}
table.tk.sortable thead th{cursor:pointer;user-select:none}
table.tk.sortable thead th[aria-sort=ascending]::after{content:" \\25B2";font-size:10px}
table.tk.sortable thead th[aria-sort=descending]::after{content:" \\25BC";font-size:10px}
table.kv th{width:220px;background:var(--soft)}
table.mesh{border-collapse:collapse;margin:4px 12px 12px 0;display:inline-table}
table.mesh td,table.mesh th{border:1px solid var(--line);padding:3px 9px;text-align:center;font-variant-numeric:tabular-nums}
table.mesh th{background:var(--soft);font-weight:500;color:var(--muted)}
.tk-plot{width:100%;min-height:120px}
.plot-fallback{color:var(--muted);font-size:13px}
code{background:var(--soft);padding:1px 4px;border-radius:3px}
pre.cmd{background:var(--soft);padding:8px 10px;white-space:pre-wrap;word-break:break-all}
.delta-bad{color:var(--crit);font-weight:600} .delta-good{color:var(--ok);font-weight:600}
"""

# Click a header to sort; cells sort by their data-v attribute (raw number) when present, else by text.
SORT_JS = """
(function(){
  function key(td){var v=td.getAttribute('data-v');if(v===null)v=td.textContent;var n=parseFloat(v);
    return (v!==''&&isFinite(v)&&!isNaN(n))?{n:n}:{s:v.toLowerCase()};}
  function cmp(a,b){if(a.n!==undefined&&b.n!==undefined)return a.n-b.n;if(a.n!==undefined)return -1;
    if(b.n!==undefined)return 1;return a.s<b.s?-1:a.s>b.s?1:0;}
  document.querySelectorAll('table.sortable').forEach(function(t){
    t.querySelectorAll('thead th').forEach(function(th,i){
      th.addEventListener('click',function(){
        var asc=th.getAttribute('aria-sort')!=='ascending';
        t.querySelectorAll('thead th').forEach(function(o){o.removeAttribute('aria-sort');});
        th.setAttribute('aria-sort',asc?'ascending':'descending');
        var body=t.tBodies[0];var rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(r1,r2){var c=cmp(key(r1.cells[i]),key(r2.cells[i]));return asc?c:-c;});
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
})();
"""

# Unpacks the gzip+base64 plotly.js bundle in memory (DecompressionStream, no request), then draws each
# figure from its JSON <script> block. Tables and text never depend on this.
PLOT_JS = """
(function(){
  var holder=document.getElementById('tk-plotlyjs');
  var plots=document.querySelectorAll('div.tk-plot');
  function fail(msg){plots.forEach(function(d){d.innerHTML='';var p=document.createElement('p');
    p.className='plot-fallback';p.textContent=msg;d.appendChild(p);});}
  function draw(){
    plots.forEach(function(div){
      var spec=JSON.parse(document.getElementById(div.getAttribute('data-fig')).textContent);
      div.innerHTML='';
      window.Plotly.newPlot(div,spec.data,spec.layout,{displaylogo:false,responsive:true,
        modeBarButtonsToRemove:['sendDataToCloud'],showLink:false,showSendToCloud:false});
    });
    document.body.setAttribute('data-plots-ready', String(plots.length));
  }
  if(!plots.length||!holder){document.body.setAttribute('data-plots-ready','0');return;}
  if(typeof DecompressionStream==='undefined'){fail('Charts need a browser with DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+); the tables hold the same numbers.');return;}
  var bin=atob(holder.textContent.trim());var bytes=new Uint8Array(bin.length);
  for(var i=0;i<bin.length;i++)bytes[i]=bin.charCodeAt(i);
  new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text().then(function(src){
    var s=document.createElement('script');s.textContent=src;document.head.appendChild(s);draw();
  }).catch(function(e){fail('Charts could not be drawn: '+e);});
})();
"""


def _plotly_js_file() -> Path | None:
    """The installed plotly.min.js (what plotly.offline.get_plotlyjs reads), found without importing
    plotly; None when plotly is not a plain package on disk."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("plotly")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path
    return None


def _cache_file(key: str) -> Path | None:
    """Where the compressed plotly.js is kept between runs, one file per plotly.js install; None: no cache."""
    try:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit"
        return root / f"plotly-{hashlib.sha256(key.encode()).hexdigest()[:16]}.min.js.gz.b64"
    except Exception:  # no home, odd environment: compress every time
        return None


@functools.lru_cache(maxsize=1)
def plotly_js_gz_b64() -> bytes:
    """plotly.js from the installed plotly package, gzipped and base64-encoded (≈2 MB instead of ≈4.8 MB;
    ASCII bytes, written as they are).
    Compressing it costs ~0.3 s of CPU, more than analysing a small trace: the result is kept in the
    user's cache folder (XDG_CACHE_HOME or ~/.cache/tracekit), keyed by the plotly.js file's path, size
    and modification time, so a run that finds it reads neither plotly.js nor plotly (reading, hashing
    and importing them cost ~0.06 s of CPU and ~20 MB of peak memory per report)."""
    src = _plotly_js_file()
    key = f"{src}:{src.stat().st_size}:{src.stat().st_mtime_ns}" if src is not None else ""
    cache = _cache_file(key) if src is not None else None
    try:
        if cache is not None and cache.is_file():
            data = cache.read_bytes()
            cut = data.find(b"\n")
            if cut >= 0 and data[:cut].decode("utf-8", "replace") == key:
                return data[cut + 1:]
    except (OSError, ValueError):
        pass
    if src is not None:
        js = src.read_bytes()
    else:
        from plotly.offline import get_plotlyjs

        js = get_plotlyjs().encode("utf-8")
    b64 = base64.b64encode(gzip.compress(js, compresslevel=9, mtime=0))
    try:
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(key.encode("utf-8") + b"\n" + b64)
            os.replace(tmp, cache)  # atomic: concurrent runs never read half a file
    except OSError:
        pass  # a read-only home: the report is the same, only slower to write
    return b64
