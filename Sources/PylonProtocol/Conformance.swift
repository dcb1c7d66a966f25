import PylonCore

/// The contract check behind `pylonctl conformance EXEC --as NAME`: does another implementation
/// of a plugin keep the real one's declared contract? Pure: the shell starts both plugins under
/// private hosts, reads each one's `bus.describe {"format":"openrpc"}` methods, makes the calls
/// this type lists and hands it the answers; every finding names its method.
///
/// What is checked (docs/TESTING-APPS.md "The contract check"):
/// - every method of the real plugin is served, and describes itself (summary, params, result);
/// - its params: each of the real one's is declared with the same JSON type; none is required
///   that the real one leaves optional;
/// - its result: the same JSON type, with each of the real one's members, of the same type;
/// - its consent switch template (`x-pylon-consent`) is the real one's;
/// - bad params (the required ones missing, the first one of a wrong type) answer what the real
///   plugin answers: the same JSON-RPC error code, or a result with the same service `code`;
/// - every answer that is a result has the real one's result shape (the bad-params calls, and
///   one call with `{}` of each method that takes no required params).
public enum Conformance {
    public struct Finding: Equatable, Sendable, CustomStringConvertible {
        public enum Level: String, Sendable { case fail = "FAIL", warn = "WARN" }
        public var level: Level
        public var method: String
        public var message: String

        public init(_ level: Level, _ method: String, _ message: String) {
            self.level = level
            self.method = method
            self.message = message
        }

        /// `FAIL push.bind: …`: one line of pylonctl's report.
        public var description: String { "\(level.rawValue) \(method): \(message)" }
    }

    /// A call the shell makes: `params` to `method`, on the real plugin too when `compare`.
    public struct Probe: Equatable, Sendable {
        public var method: String
        public var params: JSON
        /// What the call is, for messages ("params {} (userId missing)").
        public var what: String
        /// Also made on the real plugin, and the answers compared; else only the candidate's
        /// result shape is checked.
        public var compare: Bool
    }

    /// An answer as the check sees it.
    public enum Outcome: Equatable, Sendable {
        case result(JSON)
        case error(code: Int64, message: String)
        /// No answer in time (the host's -32002 or -32008, or the connection's deadline).
        case noAnswer(String)

        var text: String {
            switch self {
            case .result(let r): return "result \(Conformance.clip(r.serialized))"
            case .error(let c, let m): return "error \(c) (\(Conformance.clip(m)))"
            case .noAnswer(let why): return "no answer (\(why))"
            }
        }
    }

    /// The methods a plugin serves, from an OpenRPC document: those whose `x-pylon-plugin` is
    /// `plugin`, by name.
    public static func methods(of plugin: String, in openrpc: JSON) -> [String: JSON] {
        var out: [String: JSON] = [:]
        for m in openrpc["methods"]?.arrayValue ?? [] where m["x-pylon-plugin"]?.stringValue == plugin {
            if let n = m["name"]?.stringValue { out[n] = m }
        }
        return out
    }

    /// The declared contract compared: `reference` and `candidate` are `methods(of:in:)`.
    public static func compareDeclared(plugin: String, reference: [String: JSON], candidate: [String: JSON]) -> [Finding] {
        var out: [Finding] = []
        for name in reference.keys.sorted() {
            let r = reference[name]!
            guard let c = candidate[name] else {
                out.append(Finding(.fail, name, "missing: the real \(plugin) serves it (\(summary(r)))"))
                continue
            }
            if !declares(c) {
                out.append(
                    Finding(
                        .fail, name,
                        "declares no summary, params or result (describe it: MethodDoc in Swift, plugin.method(..., summary=, params=, result=) in Python)"
                    ))
                continue
            }
            out += compareParams(name, r, c)
            out += compareResult(name, resultSchema(r), resultSchema(c))
            let rc = r["x-pylon-consent"]?.stringValue
            let cc = c["x-pylon-consent"]?.stringValue
            if rc != cc {
                out.append(Finding(.fail, name, "consent switch \(cc ?? "none") where the real \(plugin) has \(rc ?? "none")"))
            }
        }
        for name in candidate.keys.sorted() where reference[name] == nil {
            out.append(Finding(.warn, name, "not a method of the real \(plugin) (callers of \(plugin) do not know it)"))
        }
        return out
    }

    static func summary(_ m: JSON) -> String { m["summary"]?.stringValue ?? "undocumented" }

    static func declares(_ m: JSON) -> Bool {
        m["summary"] != nil || !(m["params"]?.arrayValue ?? []).isEmpty || !(resultSchema(m).objectValue ?? [:]).isEmpty
    }

    static func resultSchema(_ m: JSON) -> JSON { m["result"]?["schema"] ?? .object([:]) }

    /// A schema's type; nil: any.
    static func type(_ schema: JSON?) -> MethodDoc.JSONType? {
        schema?["type"]?.stringValue.flatMap(MethodDoc.JSONType.init(rawValue:))
    }

    static func typeName(_ t: MethodDoc.JSONType?) -> String { t?.rawValue ?? "any" }

    static func compareParams(_ name: String, _ r: JSON, _ c: JSON) -> [Finding] {
        var out: [Finding] = []
        let rp = r["params"]?.arrayValue ?? []
        let cp = c["params"]?.arrayValue ?? []
        func byName(_ l: [JSON]) -> [String: JSON] {
            var d: [String: JSON] = [:]
            for p in l { if let n = p["name"]?.stringValue { d[n] = p } }
            return d
        }
        let rd = byName(rp)
        let cd = byName(cp)
        for p in rp {
            guard let n = p["name"]?.stringValue else { continue }
            guard let q = cd[n] else {
                out.append(
                    Finding(
                        .fail, name,
                        "param \(n) (\(typeName(type(p["schema"]))), \(isRequired(p) ? "required" : "optional")) is not declared"))
                continue
            }
            let rt = type(p["schema"])
            let ct = type(q["schema"])
            if let rt, rt != ct {
                out.append(Finding(.fail, name, "param \(n) is declared \(typeName(ct)); the real one takes \(rt.rawValue)"))
            }
            if isRequired(q), !isRequired(p) {
                out.append(Finding(.fail, name, "param \(n) is required; the real one's is optional (callers omit it)"))
            }
        }
        for q in cp {
            guard let n = q["name"]?.stringValue, rd[n] == nil, isRequired(q) else { continue }
            out.append(Finding(.fail, name, "requires param \(n), which the real one does not take (callers never send it)"))
        }
        return out
    }

    static func isRequired(_ p: JSON) -> Bool { p["required"]?.boolValue ?? false }

    static func compareResult(_ name: String, _ r: JSON, _ c: JSON) -> [Finding] {
        var out: [Finding] = []
        let rt = type(r)
        let ct = type(c)
        if let rt, rt != ct {
            out.append(Finding(.fail, name, "result is declared \(typeName(ct)); the real one answers \(rt.rawValue)"))
            return out
        }
        let cprops = c["properties"]?.objectValue ?? [:]
        let required = Set((c["required"]?.arrayValue ?? []).compactMap(\.stringValue))
        let rRequired = Set((r["required"]?.arrayValue ?? []).compactMap(\.stringValue))
        for (k, v) in (r["properties"]?.objectValue ?? [:]).sorted(by: { $0.key < $1.key }) {
            guard let cv = cprops[k] else {
                out.append(Finding(.fail, name, "result member \(k) (\(typeName(type(v)))) is not declared"))
                continue
            }
            if let t = type(v), t != type(cv) {
                out.append(Finding(.fail, name, "result member \(k) is declared \(typeName(type(cv))); the real one's is \(t.rawValue)"))
            }
            if rRequired.contains(k), !required.contains(k) {
                out.append(Finding(.fail, name, "result member \(k) is optional; the real one always has it"))
            }
        }
        return out
    }

    // MARK: Calls

    /// The calls to make for the real plugin's methods: for each method with required params,
    /// `{}` and (when its first required param has a type) that param of a wrong type, on both
    /// plugins; for each method without required params, `{}` on the candidate only.
    public static func probes(reference: [String: JSON]) -> [Probe] {
        var out: [Probe] = []
        for name in reference.keys.sorted() {
            let params = reference[name]!["params"]?.arrayValue ?? []
            let required = params.filter(isRequired)
            guard let first = required.first, let firstName = first["name"]?.stringValue else {
                out.append(Probe(method: name, params: .object([:]), what: "params {}", compare: false))
                continue
            }
            let names = required.compactMap { $0["name"]?.stringValue }.joined(separator: ", ")
            out.append(Probe(method: name, params: .object([:]), what: "params {} (\(names) missing)", compare: true))
            if let t = type(first["schema"]), let wrong = wrongValue(for: t) {
                var p = JSONObject()
                for q in required {
                    if let n = q["name"]?.stringValue, let v = sample(type(q["schema"])) { p[n] = v }
                }
                p[firstName] = wrong
                out.append(
                    Probe(
                        method: name, params: .object(p), what: "params.\(firstName) of type \(MethodDoc.JSONType.of(wrong).rawValue)",
                        compare: true))
            }
        }
        return out
    }

    /// A value that is not of type `t`.
    static func wrongValue(for t: MethodDoc.JSONType) -> JSON? {
        switch t {
        case .any: return nil
        case .string: return .int(7)
        default: return .string("not-a-\(t.rawValue)")
        }
    }

    /// A plausible value of type `t` for the other required params of a wrong-type call.
    static func sample(_ t: MethodDoc.JSONType?) -> JSON? {
        switch t {
        case .string: return "conformance"
        case .integer, .number: return .int(1)
        case .boolean: return .bool(true)
        case .object: return .object([:])
        case .array: return .array([])
        case .null, .any, .none: return .null
        }
    }

    /// The answers to one probe compared (`reference` nil for a candidate-only call); `schema`:
    /// the real method's result schema.
    public static func judge(_ probe: Probe, plugin: String, reference: Outcome?, candidate: Outcome, schema: JSON) -> [Finding] {
        var out: [Finding] = []
        let m = probe.method
        if case .result(let v) = candidate, let problem = shapeProblem(schema: schema, value: v) {
            out.append(Finding(.fail, m, "\(probe.what): the result \(problem)"))
        }
        if case .noAnswer(let why) = candidate {
            out.append(Finding(.warn, m, "\(probe.what): no answer (\(why)); not checked"))
            return out
        }
        guard probe.compare, let reference else { return out }
        switch (reference, candidate) {
        case (.error(let rc, _), .error(let cc, _)) where rc == cc: break
        case (.result(let r), .result(let c)) where serviceCode(r) == serviceCode(c): break
        case (.noAnswer, _): break
        case (.result(let r), _) where serviceCode(r) == nil || serviceCode(r) == 0: break  // the real one accepted it
        default:
            out.append(Finding(.fail, m, "\(probe.what): answers \(candidate.text); the real \(plugin) answers \(reference.text)"))
        }
        return out
    }

    /// A result's service `code` member (MA and push), nil when it has none.
    static func serviceCode(_ r: JSON) -> Int64? { r["code"]?.intValue }

    /// Why `value` does not fit `schema` (its type, its required members, its members' types), or nil.
    public static func shapeProblem(schema: JSON, value: JSON) -> String? {
        let kind = MethodDoc.JSONType.of(value)
        if let t = type(schema), !t.admits(kind: kind) { return "is \(kind.rawValue), not \(t.rawValue)" }
        guard let o = value.objectValue else { return nil }
        for k in (schema["required"]?.arrayValue ?? []).compactMap(\.stringValue) where o[k] == nil {
            return "has no member \(k)"
        }
        for (k, s) in (schema["properties"]?.objectValue ?? [:]).sorted(by: { $0.key < $1.key }) {
            guard let v = o[k], let t = type(s) else { continue }
            let vk = MethodDoc.JSONType.of(v)
            // A member may be null ("none yet": push's lastError, MA's euid before a start).
            if !t.admits(kind: vk), vk != .null {
                return "member \(k) is \(vk.rawValue), not \(t.rawValue)"
            }
        }
        return nil
    }

    static func clip(_ s: String) -> String { s.count <= 160 ? s : String(s.prefix(157)) + "..." }
}
