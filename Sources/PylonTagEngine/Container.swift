import CJSONC
import PylonCore

/// One macro, predicate or tag: a function id with its properties, indexed once. A class
/// (immutable): evaluation passes it around by reference instead of copying its fields.
public final class FunctionCall: Sendable {
    public let id: String
    public let function: FunctionID
    /// `instance_name`: a macro's name (what `getValue` asks for).
    public let name: String?
    public let negate: Bool
    public let ignoreCase: Bool
    public let notDefaultMacro: Bool
    /// Every other property (arg0, arg1, value, name, default_value, additional_params, ...).
    public let properties: [String: TagExpr]
    /// The regex of a `_re` predicate or a `_reg` macro whose pattern is a literal, compiled
    /// once at load; nil when the pattern is computed (compiled per evaluation) or invalid.
    public let regex: TagRegex?
    /// Why the literal pattern did not compile (the predicate is then always false).
    public let regexError: String?
    /// `arg0`, `arg1` and `value`, looked up once (predicates read them on every evaluation).
    public let arg0: TagExpr?
    public let arg1: TagExpr?
    public let value: TagExpr?

    init(
        id: String, function: FunctionID, name: String?, negate: Bool, ignoreCase: Bool, notDefaultMacro: Bool,
        properties: [String: TagExpr], regex: TagRegex?, regexError: String?
    ) {
        self.id = id
        self.function = function
        self.name = name
        self.negate = negate
        self.ignoreCase = ignoreCase
        self.notDefaultMacro = notDefaultMacro
        self.properties = properties
        self.regex = regex
        self.regexError = regexError
        arg0 = properties["arg0"]
        arg1 = properties["arg1"]
        value = properties["value"]
    }

    public subscript(_ key: String) -> TagExpr? { properties[key] }
}

/// One rule: predicates that must all be true (`if`), predicates that must all be false
/// (`unless`), and the tags and macro definitions it enables (`add`, `add_macro`) or blocks
/// (`block`, `block_macro`). Indices are checked at load.
public struct Rule: Sendable, Equatable {
    public var positive: [Int] = []
    public var negative: [Int] = []
    public var addTags: [Int] = []
    public var blockTags: [Int] = []
    public var addMacros: [Int] = []
    public var blockMacros: [Int] = []
    /// A clause named a predicate that does not exist: the rule never passes.
    public var broken = false
}

/// Why a container could not be loaded at all (a container that loads with warnings is not
/// an error).
public struct ContainerError: Error, CustomStringConvertible, Sendable, Equatable {
    public let description: String
    public init(_ d: String) { description = d }
}

/// A container parsed once into an immutable, indexed form. Evaluation never re-reads JSON.
public struct Container: Sendable {
    public let version: String
    public let macros: [FunctionCall]
    public let predicates: [FunctionCall]
    public let tags: [FunctionCall]
    public let rules: [Rule]
    /// Macro definitions by name, in index order.
    public let definitions: [String: [Int]]
    /// Each macro name's small integer id, the name of each id, each macro's name id (-1 when
    /// unnamed) and the definitions by name id: evaluation keys its caches by these.
    let nameIndex: [String: Int]
    let names: [String]
    let nameIds: [Int]
    let definitionsById: [[Int]]
    /// For each macro index, the rules that add or block it (only those are evaluated to
    /// select among definitions).
    let rulesForMacro: [[Int]]
    /// Rules that add or block any tag (evaluated on every event).
    public let tagRules: [Int]
    /// Problems found while loading (bad references, unknown ids, invalid regexes).
    public let warnings: [String]
    public let limits: EngineLimits

    init(
        version: String, macros: [FunctionCall], predicates: [FunctionCall], tags: [FunctionCall], rules: [Rule],
        definitions: [String: [Int]], rulesForMacro: [Int: [Int]], tagRules: [Int], warnings: [String], limits: EngineLimits
    ) {
        self.version = version
        self.macros = macros
        self.predicates = predicates
        self.tags = tags
        self.rules = rules
        self.definitions = definitions
        self.tagRules = tagRules
        self.warnings = warnings
        self.limits = limits
        var index: [String: Int] = [:]
        var names: [String] = []
        var byId: [[Int]] = []
        var ids = [Int](repeating: -1, count: macros.count)
        for (i, m) in macros.enumerated() {
            guard let n = m.name else { continue }
            if let id = index[n] {
                ids[i] = id
                byId[id].append(i)
            } else {
                index[n] = names.count
                ids[i] = names.count
                names.append(n)
                byId.append([i])
            }
        }
        nameIndex = index
        self.names = names
        nameIds = ids
        definitionsById = byId
        var forMacro = [[Int]](repeating: [], count: macros.count)
        for (m, rs) in rulesForMacro { forMacro[m] = rs.sorted() }
        self.rulesForMacro = forMacro
    }

    /// An empty container (what a container id with no default file starts with).
    public static func empty(limits: EngineLimits = EngineLimits()) -> Container {
        Container(
            version: "", macros: [], predicates: [], tags: [], rules: [], definitions: [:], rulesForMacro: [:],
            tagRules: [], warnings: [], limits: limits)
    }

    /// Parses container text: the full form (`{"resource": {...}}`, or the resource object
    /// itself). The json-c tree is indexed directly (no intermediate Swift JSON values), which
    /// is what keeps a 1 MB container's load in tens of milliseconds.
    public static func parse(text: String, limits: EngineLimits = EngineLimits()) throws(ContainerError) -> Container {
        var t = text
        let r: Result<JSONRef, JSONParseError> = t.withUTF8 { b in
            do throws(JSONParseError) {
                return .success(try JSONRef.parse(UnsafeRawBufferPointer(b), maxDepth: 256))
            } catch { return .failure(error) }
        }
        switch r {
        case .success(let ref): return try parse(ref: ref, limits: limits)
        case .failure(let e): throw ContainerError("not valid JSON: \(e.description)")
        }
    }

    /// Parses the legacy `resource` layout from a Swift value.
    public static func parse(full j: JSON, limits: EngineLimits = EngineLimits()) throws(ContainerError) -> Container {
        guard case .object = j else { throw ContainerError("a container must be a JSON object") }
        return try parse(ref: JSONRef(j), limits: limits)
    }

    static func parse(ref: JSONRef, limits: EngineLimits) throws(ContainerError) -> Container {
        guard let top = ref.ptr, json_object_get_type(top) == json_type_object else {
            throw ContainerError("a container must be a JSON object")
        }
        var res = top
        var wrapped: OpaquePointer?
        if json_object_object_get_ex(top, "resource", &wrapped) != 0 {
            guard let w = wrapped, json_object_get_type(w) == json_type_object else {
                throw ContainerError("resource must be a JSON object")
            }
            res = w
        }
        var warnings: [String] = []
        func warn(_ s: String) { if warnings.count < 1000 { warnings.append(s) } }
        func section(_ key: String) throws(ContainerError) -> OpaquePointer? {
            var v: OpaquePointer?
            guard json_object_object_get_ex(res, key, &v) != 0, let v, json_object_get_type(v) != json_type_null else { return nil }
            guard json_object_get_type(v) == json_type_array else { throw ContainerError("\(key) must be an array") }
            let n = json_object_array_length(v)
            guard n <= limits.maxEntries else { throw ContainerError("\(key) has \(n) entries (limit \(limits.maxEntries))") }
            return v
        }
        let rawMacros = try section("macros")
        let rawPredicates = try section("predicates")
        let rawTags = try section("tags")
        let rawRules = try section("rules")
        var version = ""
        var vp: OpaquePointer?
        if json_object_object_get_ex(res, "version", &vp) != 0, let vp {
            switch json_object_get_type(vp) {
            case json_type_string, json_type_int: version = String(cString: json_object_get_string(vp))
            default: break
            }
        }
        let nMacros = rawMacros.map { json_object_array_length($0) } ?? 0
        func calls(_ arr: OpaquePointer?, _ what: String) -> [FunctionCall] {
            guard let arr else { return [] }
            let n = json_object_array_length(arr)
            var out: [FunctionCall] = []
            out.reserveCapacity(n)
            for i in 0..<n {
                out.append(
                    parseCall(json_object_array_get_idx(arr, i), what: "\(what) \(i)", macroCount: nMacros, limits: limits, warn: warn))
            }
            return out
        }
        let macros = calls(rawMacros, "macro")
        let predicates = calls(rawPredicates, "predicate")
        let tags = calls(rawTags, "tag")
        for (i, p) in predicates.enumerated() where !p.function.isPredicate {
            warn("predicate \(i): \(p.id.isEmpty ? "no function" : p.id) is not a predicate function (always false)")
        }
        var rules: [Rule] = []
        if let rawRules {
            let n = json_object_array_length(rawRules)
            rules.reserveCapacity(n)
            for ri in 0..<n {
                rules.append(
                    parseRule(
                        json_object_array_get_idx(rawRules, ri), index: ri, predicates: predicates.count,
                        tags: tags.count, macros: nMacros, warn: warn))
            }
        }
        var defs: [String: [Int]] = [:]
        for (i, m) in macros.enumerated() {
            if let n = m.name { defs[n, default: []].append(i) }
        }
        var forMacro: [Int: [Int]] = [:]
        var tagRules: [Int] = []
        for (ri, r) in rules.enumerated() {
            for m in Set(r.addMacros + r.blockMacros) { forMacro[m, default: []].append(ri) }
            if !r.addTags.isEmpty || !r.blockTags.isEmpty { tagRules.append(ri) }
        }
        return Container(
            version: version, macros: macros, predicates: predicates, tags: tags, rules: rules,
            definitions: defs, rulesForMacro: forMacro, tagRules: tagRules, warnings: warnings, limits: limits)
    }

    /// A plain default container (`.json` or `.plist`): a flat object whose top-level keys are
    /// constant values with no rules. A top level that is not an object, and top-level values
    /// that are arrays or null, are rejected (nested maps and lists inside maps are fine).
    public static func plain(_ j: JSON, limits: EngineLimits = EngineLimits()) throws(ContainerError) -> Container {
        guard let o = j.objectValue else {
            throw ContainerError("a plain container must be a flat object of key → value (got \(j.kindName) at the top level)")
        }
        var macros: [FunctionCall] = []
        var defs: [String: [Int]] = [:]
        for (k, v) in o {
            switch v {
            case .array:
                throw ContainerError("a plain container's value for \"\(k)\" is an array: arrays are not supported at the top level")
            case .null: throw ContainerError("a plain container's value for \"\(k)\" is null: null is not supported at the top level")
            default: break
            }
            defs[k] = [macros.count]
            macros.append(
                FunctionCall(
                    id: "_c", function: .constant, name: k, negate: false, ignoreCase: false,
                    notDefaultMacro: false, properties: ["value": .literal(v)], regex: nil, regexError: nil))
        }
        return Container(
            version: "", macros: macros, predicates: [], tags: [], rules: [], definitions: defs,
            rulesForMacro: [:], tagRules: [], warnings: [], limits: limits)
    }

    static func flag(_ p: OpaquePointer?) -> Bool {
        guard let p else { return false }
        switch json_object_get_type(p) {
        case json_type_boolean: return json_object_get_boolean(p) != 0
        case json_type_string: return String(cString: json_object_get_string(p)).lowercased() == "true"
        case json_type_int: return json_object_get_int64(p) != 0
        default: return false
        }
    }

    static func parseCall(_ o: OpaquePointer?, what: String, macroCount: Int, limits: EngineLimits, warn: (String) -> Void) -> FunctionCall
    {
        guard let o, json_object_get_type(o) == json_type_object else {
            warn("\(what) is not an object")
            return FunctionCall(
                id: "", function: .unknown(""), name: nil, negate: false, ignoreCase: false,
                notDefaultMacro: false, properties: [:], regex: nil, regexError: nil)
        }
        var id = ""
        var name: String?
        var negate = false, ignoreCase = false, notDefault = false
        var props: [String: TagExpr] = [:]
        var it = json_object_iter_begin(o)
        var end = json_object_iter_end(o)
        while json_object_iter_equal(&it, &end) == 0 {
            let k = String(cString: json_object_iter_peek_name(&it))
            let v = json_object_iter_peek_value(&it)
            json_object_iter_next(&it)
            switch k {
            case "function":
                if let v, json_object_get_type(v) == json_type_string { id = String(cString: json_object_get_string(v)) }
            case "instance_name":
                if let v, json_object_get_type(v) == json_type_string || json_object_get_type(v) == json_type_int {
                    name = String(cString: json_object_get_string(v))
                }
            case "negate": negate = flag(v)
            case "ignore_case": ignoreCase = flag(v)
            case "not_default_macro": notDefault = flag(v)
            default: props[k] = TagExpr.parse(ref: v, macroCount: macroCount, depth: 0, warn: { warn("\(what).\(k): \($0)") })
            }
        }
        if id.isEmpty { warn("\(what) has no function id") }
        let fn = FunctionID(id)
        if case .unknown = fn, !id.isEmpty { warn("\(what): \(id) has no backing implementation") }
        var regex: TagRegex?
        var regexError: String?
        if fn == .regex || fn == .regexGroup, case .literal(let lit)? = props["arg1"], let pattern = lit.scalarString {
            do { regex = try TagRegex(pattern, ignoreCase: ignoreCase, limits: limits) } catch {
                regexError = error.description
                warn("\(what): \(error.description)")
            }
        }
        return FunctionCall(
            id: id, function: fn, name: name, negate: negate, ignoreCase: ignoreCase,
            notDefaultMacro: notDefault, properties: props, regex: regex, regexError: regexError)
    }

    static func parseRule(_ raw: OpaquePointer?, index ri: Int, predicates: Int, tags: Int, macros: Int, warn: (String) -> Void) -> Rule {
        var r = Rule()
        guard let raw, json_object_get_type(raw) == json_type_array else {
            warn("rule \(ri) is not an array (never passes)")
            r.broken = true
            return r
        }
        for ci in 0..<json_object_array_length(raw) {
            let clause = json_object_array_get_idx(raw, ci)
            guard let clause, json_object_get_type(clause) == json_type_array, json_object_array_length(clause) >= 1,
                let first = json_object_array_get_idx(clause, 0), json_object_get_type(first) == json_type_string
            else {
                warn("rule \(ri): a clause is not [kind, index...] (rule never passes)")
                r.broken = true
                continue
            }
            let kind = String(cString: json_object_get_string(first))
            let bound: Int
            switch kind {
            case "if", "unless": bound = predicates
            case "add", "block", "remove": bound = tags
            case "add_macro", "block_macro", "remove_macro": bound = macros
            default:
                warn("rule \(ri): unknown clause \(kind) (rule never passes)")
                r.broken = true
                continue
            }
            var idx: [Int] = []
            let n = json_object_array_length(clause)
            for k in 1..<max(1, n) {
                let v = json_object_array_get_idx(clause, k)
                guard let v, json_object_get_type(v) == json_type_int, case let i = json_object_get_int64(v), i >= 0, i < Int64(bound)
                else {
                    warn("rule \(ri): \(kind) index \(JSONRef.toJSON(v).serialized) out of range (\(bound))")
                    if kind == "if" || kind == "unless" { r.broken = true }
                    continue
                }
                idx.append(Int(json_object_get_int64(v)))
            }
            switch kind {
            case "if": r.positive += idx
            case "unless": r.negative += idx
            case "add": r.addTags += idx
            case "block", "remove": r.blockTags += idx
            case "add_macro": r.addMacros += idx
            default: r.blockMacros += idx
            }
        }
        return r
    }
}

extension JSON {
    var kindName: String {
        switch self {
        case .null: return "null"
        case .bool: return "a boolean"
        case .int, .double: return "a number"
        case .string: return "a string"
        case .array: return "an array"
        case .object: return "an object"
        }
    }

    /// The string form of a scalar (nil for lists and maps and null).
    var scalarString: String? {
        switch self {
        case .string(let s): return s
        case .int(let i): return String(i)
        case .double(let d): return TagConversion.doubleText(d)
        case .bool(let b): return b ? "true" : "false"
        default: return nil
        }
    }
}
