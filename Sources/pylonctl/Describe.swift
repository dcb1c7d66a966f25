import PylonClientKit

let pylonClientVersion = "0.1.0"

struct DescribedMethod {
    let name: String
    let consent: String?
    let onDenied: String?
    /// Parameters the manifest names: its `params` list, else the `{field}`s of the consent template.
    let params: [String]
}

/// Every method `bus.describe` lists: the host's, then each plugin's from its manifest.
func describedMethods(_ d: JSON) -> [DescribedMethod] {
    var out = (d["host"]?.arrayValue ?? []).compactMap { $0.stringValue }.map {
        DescribedMethod(name: $0, consent: nil, onDenied: nil, params: [])
    }
    for (_, p) in d["plugins"]?.objectValue ?? JSONObject() {
        for m in p["methods"]?.arrayValue ?? [] {
            guard let name = m["name"]?.stringValue else { continue }
            let consent = m["consent"]?.stringValue
            var params = (m["params"]?.arrayValue ?? []).compactMap { $0.stringValue ?? $0["name"]?.stringValue }
            if params.isEmpty, let c = consent { params = templateFields(c) }
            out.append(DescribedMethod(name: name, consent: consent, onDenied: m["onDenied"]?.stringValue, params: params))
        }
    }
    return out
}

/// `ma:{appKey}` → ["appKey"].
func templateFields(_ t: String) -> [String] {
    var out: [String] = []
    var cur: String?
    for c in t {
        if c == "{" { cur = "" } else if c == "}" { if let f = cur { out.append(f) }; cur = nil } else if cur != nil { cur!.append(c) }
    }
    return out
}

/// The readable form of `bus.describe`: one block per plugin, one line per method.
func describeText(_ d: JSON) -> String {
    var lines: [String] = []
    let host = (d["host"]?.arrayValue ?? []).compactMap { $0.stringValue }
    lines.append("host (pylond): " + host.joined(separator: " "))
    let all = describedMethods(d)
    for (name, p) in d["plugins"]?.objectValue ?? JSONObject() {
        lines.append("")
        var head = "\(name) \(fmt(p["version"])) (\(fmt(p["state"])))"
        let pubs = (p["publishes"]?.arrayValue ?? []).compactMap { $0.stringValue }
        if !pubs.isEmpty { head += "  publishes: " + pubs.joined(separator: " ") }
        let subs = (p["subscribes"]?.arrayValue ?? []).compactMap { $0.stringValue }
        if !subs.isEmpty { head += "  subscribes: " + subs.joined(separator: " ") }
        lines.append(head)
        for m in all where m.name.hasPrefix(name + ".") {
            var l = "  " + pad(m.name, 30)
            if !m.params.isEmpty { l += " params: " + m.params.joined(separator: ", ") }
            if let c = m.consent {
                l += "  consent: \(c) (" + (m.onDenied == "drop" ? "dropped" : "refused -32003") + " when denied)"
            }
            lines.append(l)
        }
    }
    return lines.joined(separator: "\n")
}
