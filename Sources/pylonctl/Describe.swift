import PylonClientKit

let pylonClientVersion = "0.1.0"

struct DescribedMethod {
    struct Param {
        let name: String
        let type: String
        let required: Bool
        let description: String
    }
    let name: String
    /// Who serves it: `pylond` or the plugin's name.
    let servedBy: String
    let consent: String?
    let onDenied: String?
    let summary: String?
    /// The method's declared params; without any (an older plugin), the `{field}`s of the
    /// consent template, with type `string`.
    let params: [Param]
    /// The result's `{type, description, fields?}`, if declared.
    let result: JSON?
    let hostChecksParams: Bool
}

/// Every method `bus.describe` lists: the host's (with their docs from `hostMethods`, else the
/// names in `host`), then each plugin's from its manifest.
func describedMethods(_ d: JSON) -> [DescribedMethod] {
    var out: [DescribedMethod] = []
    if let hm = d["hostMethods"]?.arrayValue {
        out = hm.compactMap { described($0, servedBy: "pylond") }
    } else {
        out = (d["host"]?.arrayValue ?? []).compactMap { $0.stringValue }.map {
            DescribedMethod(
                name: $0, servedBy: "pylond", consent: nil, onDenied: nil, summary: nil, params: [], result: nil, hostChecksParams: false)
        }
    }
    for (plugin, p) in d["plugins"]?.objectValue ?? JSONObject() {
        out += (p["methods"]?.arrayValue ?? []).compactMap { described($0, servedBy: plugin) }
    }
    return out
}

private func described(_ m: JSON, servedBy: String) -> DescribedMethod? {
    guard let name = m["name"]?.stringValue else { return nil }
    let consent = m["consent"]?.stringValue
    var params: [DescribedMethod.Param] = (m["params"]?.arrayValue ?? []).compactMap { p in
        if let s = p.stringValue { return .init(name: s, type: "any", required: false, description: "") }
        guard let n = p["name"]?.stringValue else { return nil }
        return .init(
            name: n, type: p["type"]?.stringValue ?? "any", required: p["required"]?.boolValue ?? false,
            description: p["description"]?.stringValue ?? "")
    }
    if params.isEmpty, m["params"] == nil, let c = consent {
        params = templateFields(c).map { .init(name: $0, type: "string", required: false, description: "(consent template field)") }
    }
    return DescribedMethod(
        name: name, servedBy: servedBy, consent: consent, onDenied: m["onDenied"]?.stringValue, summary: m["summary"]?.stringValue,
        params: params, result: m["result"], hostChecksParams: m["hostChecksParams"]?.boolValue ?? false)
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
        for m in all where m.servedBy == name {
            var l = "  " + pad(m.name, 30)
            if !m.params.isEmpty { l += " params: " + m.params.map { $0.required ? $0.name + "*" : $0.name }.joined(separator: ", ") }
            if let c = m.consent {
                l += "  consent: \(c) (" + (m.onDenied == "drop" ? "dropped" : "refused -32003") + " when denied)"
            }
            lines.append(l)
        }
    }
    lines.append("")
    lines.append("(* required; pylonctl describe METHOD for one method's params and result)")
    return lines.joined(separator: "\n")
}

/// `pylonctl describe METHOD`: one method, like `busctl introspect` shows an interface: its
/// summary, who serves it, its consent switch, a params table and the result's shape. nil for a
/// method `bus.describe` does not list.
func describeMethodText(_ d: JSON, _ method: String) -> String? {
    guard let m = describedMethods(d).first(where: { $0.name == method }) else { return nil }
    var lines = ["\(m.name)  (\(m.servedBy == "pylond" ? "host method, pylond" : "plugin \(m.servedBy)"))"]
    if let s = m.summary, !s.isEmpty { lines.append("  " + s) }
    if let c = m.consent {
        lines.append("  consent: \(c) (" + (m.onDenied == "drop" ? "dropped with the plugin's answer" : "refused -32003") + " when denied)")
    } else {
        lines.append("  consent: none")
    }
    lines.append("")
    if m.params.isEmpty {
        lines.append(m.summary == nil ? "  params: not declared (the plugin sends no docs)" : "  params: none")
    } else {
        lines.append("  " + pad("PARAM", 22) + pad("TYPE", 9) + pad("REQUIRED", 10) + "DESCRIPTION")
        for p in m.params {
            lines.append("  " + pad(p.name, 22) + pad(p.type, 9) + pad(p.required ? "yes" : "no", 10) + p.description)
        }
        if m.hostChecksParams { lines.append("  (the host checks these params before routing: -32602 naming the param)") }
    }
    lines.append("")
    if let r = m.result {
        let desc = r["description"]?.stringValue ?? ""
        lines.append("  result: " + (r["type"]?.stringValue ?? "any") + (desc.isEmpty ? "" : "  " + desc))
        let fields = r["fields"]?.arrayValue ?? []
        if !fields.isEmpty {
            lines.append("  " + pad("MEMBER", 22) + pad("TYPE", 9) + pad("ALWAYS", 10) + "DESCRIPTION")
            for f in fields {
                lines.append(
                    "  " + pad(f["name"]?.stringValue ?? "?", 22) + pad(f["type"]?.stringValue ?? "any", 9)
                        + pad(f["required"]?.boolValue == true ? "yes" : "no", 10) + (f["description"]?.stringValue ?? ""))
            }
        }
    } else {
        lines.append("  result: not declared")
    }
    return lines.joined(separator: "\n")
}

/// One method's entry of `bus.describe` (`hostMethods` or a plugin's manifest), with `plugin`.
func describedMethodJSON(_ d: JSON, _ method: String) -> JSON? {
    if let m = d["hostMethods"]?.arrayValue?.first(where: { $0["name"]?.stringValue == method }), case .object(var o) = m {
        o["plugin"] = "pylond"
        return .object(o)
    }
    for (plugin, p) in d["plugins"]?.objectValue ?? JSONObject() {
        if let m = p["methods"]?.arrayValue?.first(where: { $0["name"]?.stringValue == method }), case .object(var o) = m {
            o["plugin"] = .string(plugin)
            return .object(o)
        }
    }
    return nil
}
