import Foundation
import HeraldCore

extension HTMLReport {
    // MARK: per-node summaries

    struct NodeSummary {
        let node: Int
        let meanContinuity: Double
        let detected: Int
        let lowestPeer: Int?
        let lowestContinuity: Double
        let longestGap: Double?
    }

    /// Per device as observer (`asObserver`) or as observed: mean strict continuity over all its
    /// n-1 peers (an undetected pair counts 0), peers detected, its worst peer. Worst first.
    static func nodeSummaries(_ m: ReportModel, asObserver: Bool) -> [NodeSummary] {
        let n = m.n
        guard n > 1 else { return [] }
        var out = [NodeSummary]()
        for i in 0..<n {
            var sum = 0.0, detected = 0, lowest: Int?, lowestC = Double.infinity, gap: Double?
            for j in 0..<n where j != i {
                let (o, d) = asObserver ? (i, j) : (j, i)
                let c = m.continuity(o, d)
                sum += c
                if m.detected[o * n + d] { detected += 1 }
                if c < lowestC { lowestC = c; lowest = j }
                if let g = m.gap(o, d) { gap = max(gap ?? g, g) }
            }
            out.append(NodeSummary(node: i, meanContinuity: sum / Double(n - 1), detected: detected, lowestPeer: lowest, lowestContinuity: lowestC, longestGap: gap))
        }
        return out.sorted { a, b in
            if a.meanContinuity != b.meanContinuity { return a.meanContinuity < b.meanContinuity }
            if a.detected != b.detected { return a.detected < b.detected }
            return a.node < b.node
        }
    }

    static func nodeSummariesSection(_ m: ReportModel) -> String {
        guard m.n > 1 else { return "<p>Fewer than two devices.</p>" }
        func table(_ title: String, _ rows: [NodeSummary], peer: String) -> String {
            var s = "<div><h3>\(title)</h3><div class=\"scroll\"><table><tr><th class=\"l\">node</th><th>mean continuity %</th><th>peers detected</th><th class=\"l\">lowest \(peer)</th><th>longest gap s</th></tr>"
            for r in rows {
                let lowest = r.lowestPeer.map { j in
                    let (o, d) = peer == "observed" ? (r.node, j) : (j, r.node)
                    return "\(esc(m.names[j])) " + (m.detected[o * m.n + d] ? "\(f(r.lowestContinuity, 1))%" : "not detected")
                } ?? "–"
                s += "<tr><td class=\"l\">\(esc(m.names[r.node]))</td><td>\(f(r.meanContinuity, 1))</td><td>\(r.detected) of \(m.n - 1)</td><td class=\"l\">\(lowest)</td><td>\(f(r.longestGap, 0))</td></tr>"
            }
            return s + "</table></div></div>"
        }
        return "<div class=\"grid\">" + table("Who sees least (as observer)", nodeSummaries(m, asObserver: true), peer: "observed")
            + table("Who is seen least (as observed)", nodeSummaries(m, asObserver: false), peer: "observer") + "</div>"
            + "<p class=\"small\">Mean strict continuity over all other devices (an undetected pair counts 0%), worst first.</p>"
    }

    // MARK: all pairs: a compact table, filtered and paged by a small inline script

    /// Text as a JavaScript string literal that is safe inside `<script>`.
    static func jsString(_ s: String) -> String {
        var out = "\""
        for c in s.unicodeScalars {
            switch c {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "<", ">", "&", "\u{2028}", "\u{2029}": out += String(format: "\\u%04x", c.value)
            default:
                if c.value < 0x20 { out += String(format: "\\u%04x", c.value) } else { out.unicodeScalars.append(c) }
            }
        }
        return out + "\""
    }

    /// A figure rounded to a whole number; nil when it is not finite (a summary from outside can
    /// hold anything): the table shows –, the page's data null.
    static func whole(_ v: Double) -> String? { v.isFinite ? String(Saturating.int(v.rounded())) : nil }

    static func pairRow(_ m: ReportModel, _ o: Int, _ d: Int) -> String {
        let p = m.pairs[o * m.n + d]
        let t = m.result.parameters.cetotal
        let c = t > 0 ? Double(p?.strictWindows ?? 0) * 100 / Double(t) : 0
        return "<tr><td class=l>\(esc(m.names[o]))<td class=l>\(esc(m.names[d]))<td>\(m.detected[o * m.n + d] ? "yes" : "no")<td>\(p?.rssiSamples ?? 0)<td>\(String(format: "%.1f", c))<td>\(p.map { whole($0.longestGap) ?? "–" } ?? "–")<td>\(p?.rssiMedian.flatMap(whole) ?? "–")"
    }

    static func allPairsSection(_ m: ReportModel) -> String {
        let n = m.n, total = n * max(0, n - 1)
        guard total > 0 else { return "<p>No pairs.</p>" }
        var s = "<p class=\"filters\">observer <input id=\"fo\" size=\"10\"> observed <input id=\"fd\" size=\"10\"> detected <select id=\"ft\"><option value=\"\">any</option><option value=\"1\">yes</option><option value=\"0\">no</option></select>"
        s += " continuity below <input id=\"fc\" type=\"number\" min=\"0\" max=\"101\" step=\"1\" style=\"width:5em\">%"
        s += " order <select id=\"fs\"><option value=\"0\">observer, observed</option><option value=\"1\">lowest continuity</option><option value=\"2\">longest gap</option></select>"
        s += " <button id=\"pp\" type=\"button\">‹ previous</button> <span id=\"pn\">the first \(min(pageSize, total)) of \(total) pairs</span> <button id=\"px\" type=\"button\">next ›</button></p>"
        s += "<table id=\"pt\"><thead><tr><th class=\"l\">observer</th><th class=\"l\">observed</th><th>detected</th><th>samples</th><th>continuity %</th><th>longest gap s</th><th>RSSI median</th></tr></thead><tbody id=\"pb\">"
        for (o, d) in m.orderedPairs.prefix(pageSize) { s += pairRow(m, o, d) }
        s += "</tbody></table>"
        s += "<p class=\"small\">A name matches exactly if some device has that name, otherwise as part of a name. Samples: RSSI rows in the contact event; continuity: strict. Every figure of every pair is in pairs.csv and summary.json.</p>"

        // Data: per ordered pair in table order, [detected, samples, strict windows, longest gap s, RSSI median].
        var data = [String]()
        data.reserveCapacity(total * 5)
        for (o, d) in m.orderedPairs {
            let p = m.pairs[o * n + d]
            data.append(m.detected[o * n + d] ? "1" : "0")
            data.append(String(p?.rssiSamples ?? 0))
            data.append(String(p?.strictWindows ?? 0))
            data.append(p.flatMap { whole($0.longestGap) } ?? "null")
            data.append(p?.rssiMedian.flatMap(whole) ?? "null")
        }
        s += "<script>\n(function(){\n"
        s += "var N=[" + m.names.map(jsString).joined(separator: ",") + "],T=\(m.result.parameters.cetotal),P=\(pageSize),\n"
        s += "D=[" + data.joined(separator: ",") + "];\n"
        s += pairScript
        s += "})();\n</script>"
        return s
    }

    /// The table's and heatmap's behaviour; kept small and free of console output.
    static let pairScript = #"""
    var n=N.length,pg=0,L=[];
    function $(i){return document.getElementById(i)}
    function e(s){return s.replace(/&/g,'&amp;').replace(/</g,'&lt;').replace(/>/g,'&gt;')}
    function od(k){var o=Math.floor(k/(n-1)),d=k%(n-1);return [o,d>=o?d+1:d]}
    function c(k){return T?D[5*k+2]*100/T:0}
    function g(k){return D[5*k+3]==null?-1:D[5*k+3]}
    function v(x){return x==null?'\u2013':String(x)}
    function sel(t){t=t.trim().toLowerCase();if(!t)return null;var s={},i;
     for(i=0;i<n;i++)if(N[i].toLowerCase()==t){s[i]=1;return s}
     for(i=0;i<n;i++)if(N[i].toLowerCase().indexOf(t)>=0)s[i]=1;return s}
    function run(){var so=sel($('fo').value),sd=sel($('fd').value),dt=$('ft').value,mx=parseFloat($('fc').value),o=$('fs').value,k,p;L=[];
     for(k=0;k<n*(n-1);k++){p=od(k);if(so&&!so[p[0]])continue;if(sd&&!sd[p[1]])continue;
      if(dt!==''&&String(D[5*k])!==dt)continue;if(!isNaN(mx)&&!(c(k)<mx))continue;L.push(k)}
     if(o=='1')L.sort(function(a,b){return c(a)-c(b)||g(b)-g(a)||a-b});
     if(o=='2')L.sort(function(a,b){return g(b)-g(a)||c(a)-c(b)||a-b});
     pg=0;show()}
    function show(){var pages=Math.max(1,Math.ceil(L.length/P)),h='',i,k,p,b;pg=Math.min(Math.max(pg,0),pages-1);
     for(i=pg*P;i<Math.min(L.length,(pg+1)*P);i++){k=L[i];p=od(k);b=5*k;
      h+='<tr><td class=l>'+e(N[p[0]])+'<td class=l>'+e(N[p[1]])+'<td>'+(D[b]?'yes':'no')+'<td>'+D[b+1]+'<td>'+c(k).toFixed(1)+'<td>'+v(D[b+3])+'<td>'+v(D[b+4])}
     $('pb').innerHTML=h;
     $('pn').textContent=L.length?'pairs '+(pg*P+1)+'\u2013'+Math.min(L.length,(pg+1)*P)+' of '+L.length:'no pair matches';
     $('pp').disabled=pg==0;$('px').disabled=(pg+1)*P>=L.length}
    ['fo','fd','fc'].forEach(function(i){$(i).addEventListener('input',run)});
    ['ft','fs'].forEach(function(i){$(i).addEventListener('change',run)});
    $('pp').addEventListener('click',function(){pg--;show()});
    $('px').addEventListener('click',function(){pg++;show()});
    var hm=$('hm'),hi=$('hmi'),h0=hi?hi.innerHTML:'';
    function at(t){if(!t||t.tagName!='TD')return null;var o=t.parentNode.rowIndex-1,d=t.cellIndex-1;return o>=0&&o<n&&d>=0&&d<n?[o,d]:null}
    if(hm&&hi){
     hm.addEventListener('mouseover',function(ev){var p=at(ev.target),k,b;if(!p)return;
      if(p[0]==p[1]){hi.textContent=N[p[0]]+' (self)';return}
      k=p[0]*(n-1)+(p[1]>p[0]?p[1]-1:p[1]);b=5*k;
      hi.textContent=N[p[0]]+' sees '+N[p[1]]+': '+(D[b]?'detected':'not detected')+', continuity '+c(k).toFixed(1)+'% ('+D[b+2]+' of '+T+' windows), longest gap '+v(D[b+3])+' s, '+D[b+1]+' RSSI samples, median '+v(D[b+4])+' dBm'});
     hm.addEventListener('mouseleave',function(){hi.innerHTML=h0});
     hm.addEventListener('click',function(ev){var p=at(ev.target);if(!p||p[0]==p[1])return;
      $('fo').value=N[p[0]];$('fd').value=N[p[1]];$('ft').value='';$('fc').value='';run();$('all').scrollIntoView()})}
    run();

    """#
}
