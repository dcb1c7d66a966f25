import PylonCore

/// What a method says about itself: a one-line summary, its params (name, JSON type, required,
/// one line each) and the shape of its result. Plugins declare one per method
/// (`Plugin.describe`), the host one per host method; it travels in the `bus.hello` manifest
/// (`helloJSON`, read back by `parse`) and is shown by `bus.describe`, in Pylon's form or as an
/// OpenRPC document (`OpenRPC`).
public struct MethodDoc: Equatable, Sendable {
    /// The JSON types a param or a result can have (JSON Schema's `type` names); `any`: no
    /// one type (the method takes several forms).
    public enum JSONType: String, Equatable, Sendable, CaseIterable {
        case string, integer, number, boolean, object, array, null, any

        /// Whether `value` is of this type (`integer` is also a `number`).
        public func admits(_ value: JSON) -> Bool { admits(kind: JSONType.of(value)) }

        /// Whether a value whose own type is `kind` (`of`) is of this type.
        public func admits(kind: JSONType) -> Bool {
            self == .any || self == kind || (self == .number && kind == .integer)
        }

        /// A value's own type: `integer` for a whole number, `number` for another.
        public static func of(_ value: JSON) -> JSONType {
            switch value {
            case .null: return .null
            case .bool: return .boolean
            case .int: return .integer
            case .double(let d): return d == d.rounded() && abs(d) < 9.0e15 ? .integer : .number
            case .string: return .string
            case .array: return .array
            case .object: return .object
            }
        }
    }

    /// One param, or one member of a result.
    public struct Param: Equatable, Sendable {
        public var name: String
        public var type: JSONType
        /// A param: the caller must send it. A result member: it is always there.
        public var required: Bool
        public var description: String

        public init(_ name: String, _ type: JSONType, required: Bool = false, _ description: String) {
            self.name = name
            self.type = type
            self.required = required
            self.description = description
        }
    }

    /// The result's shape: its type, one line, and for an object its members.
    public struct Result: Equatable, Sendable {
        public var type: JSONType
        public var description: String
        public var fields: [Param]

        public init(_ type: JSONType = .object, _ description: String, fields: [Param] = []) {
            self.type = type
            self.description = description
            self.fields = fields
        }
    }

    public var summary: String
    public var params: [Param]
    public var result: Result
    /// The host may check these params before routing (slow path only; docs/PROTOCOL.md "Method
    /// descriptions"): a missing required param or a wrong type answers -32602 without reaching
    /// the plugin. Only for methods whose plugin answers such params with -32602 itself (MA's
    /// methods answer `{"code":-3}`, so they leave it off).
    public var hostChecksParams: Bool

    public init(_ summary: String, params: [Param] = [], result: Result, hostChecksParams: Bool = false) {
        self.summary = summary
        self.params = params
        self.result = result
        self.hostChecksParams = hostChecksParams
    }

    // MARK: Wire form

    /// `{"summary", "params": [{name, type, required, description}], "result": {type,
    /// description, fields?}, "hostChecksParams"?}`: the members a manifest method entry gains.
    public var wireMembers: JSONObject {
        var o: JSONObject = [
            "summary": .string(summary),
            "params": .array(params.map(\.json)),
            "result": result.json,
        ]
        if hostChecksParams { o["hostChecksParams"] = true }
        return o
    }

    /// Reads the doc members of a manifest method entry: nil when it has none (an older
    /// plugin); a bad entry throws a message naming what is wrong (`bus.hello` refuses it).
    public static func parse(_ o: JSONObject) throws(DocError) -> MethodDoc? {
        guard o["summary"] != nil || o["params"] != nil || o["result"] != nil else { return nil }
        guard let summary = o["summary"]?.stringValue else { throw DocError("summary (string) is required with params or result") }
        var params: [Param] = []
        if let p = o["params"] {
            guard let list = p.arrayValue else { throw DocError("params must be an array") }
            guard list.count <= MethodDoc.maxParams else { throw DocError("more than \(MethodDoc.maxParams) params") }
            for (i, e) in list.enumerated() {
                let param = try Param.parse(e, what: "params[\(i)]")
                if params.contains(where: { $0.name == param.name }) { throw DocError("params[\(i)]: \(param.name) appears twice") }
                params.append(param)
            }
        }
        guard let rj = o["result"]?.objectValue else { throw DocError("result ({type, description, fields?}) is required") }
        guard let rt = rj["type"]?.stringValue.flatMap(JSONType.init(rawValue:)) else {
            throw DocError("result.type must be one of \(JSONType.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        var fields: [Param] = []
        if let f = rj["fields"] {
            guard let list = f.arrayValue else { throw DocError("result.fields must be an array") }
            guard list.count <= MethodDoc.maxParams else { throw DocError("more than \(MethodDoc.maxParams) result fields") }
            for (i, e) in list.enumerated() { fields.append(try Param.parse(e, what: "result.fields[\(i)]")) }
        }
        let checks = o["hostChecksParams"]
        guard checks == nil || checks?.boolValue != nil else { throw DocError("hostChecksParams must be a boolean") }
        return MethodDoc(
            summary, params: params, result: Result(rt, rj["description"]?.stringValue ?? "", fields: fields),
            hostChecksParams: checks?.boolValue ?? false)
    }

    /// Most params (and result members) one method may declare; a longer list is refused.
    public static let maxParams = 64

    public struct DocError: Error, Equatable, CustomStringConvertible {
        public let description: String
        init(_ d: String) { description = d }
    }

    /// The first param the host refuses, or nil. `kind` gives the own type (`JSONType.of`) of
    /// the request's top-level param `name`, nil when absent. Absent params count as `{}`;
    /// positional params (an array) are the plugin's to judge (`isObject` false, `isAbsent`
    /// false). A null optional param counts as absent.
    public func paramProblem(isObject: Bool, isAbsent: Bool, kind: (String) -> JSONType?) -> (param: String, message: String)? {
        guard isObject || isAbsent else { return nil }
        for p in params {
            let k = isAbsent ? nil : kind(p.name)
            guard let k, k != .null || p.required else {
                if p.required { return (p.name, "params.\(p.name) (\(p.type.rawValue)) is required") }
                continue
            }
            if !p.type.admits(kind: k) { return (p.name, "params.\(p.name) must be of type \(p.type.rawValue), not \(k.rawValue)") }
        }
        return nil
    }
}

extension MethodDoc.Param {
    var json: JSON {
        [
            "name": .string(name), "type": .string(type.rawValue), "required": .bool(required),
            "description": .string(description),
        ]
    }

    static func parse(_ j: JSON, what: String) throws(MethodDoc.DocError) -> MethodDoc.Param {
        guard let o = j.objectValue, let name = o["name"]?.stringValue, !name.isEmpty else {
            throw MethodDoc.DocError("\(what): name (non-empty string) is required")
        }
        guard let t = o["type"]?.stringValue.flatMap(MethodDoc.JSONType.init(rawValue:)) else {
            throw MethodDoc.DocError(
                "\(what) (\(name)): type must be one of \(MethodDoc.JSONType.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        let r = o["required"]
        guard r == nil || r?.boolValue != nil else { throw MethodDoc.DocError("\(what) (\(name)): required must be a boolean") }
        return MethodDoc.Param(name, t, required: r?.boolValue ?? false, o["description"]?.stringValue ?? "")
    }
}

extension MethodDoc.Result {
    var json: JSON {
        var o: JSONObject = ["type": .string(type.rawValue), "description": .string(description)]
        if !fields.isEmpty { o["fields"] = .array(fields.map(\.json)) }
        return .object(o)
    }
}
