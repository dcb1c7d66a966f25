import PylonCore

/// One macro, predicate or tag: a function id with its properties, indexed once.
public struct FunctionCall: Sendable {
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
    /// For each macro index, the rules that add or block it (only those are evaluated to
    /// select among definitions).
    public let rulesForMacro: [Int: [Int]]
    /// Rules that add or block any tag (evaluated on every event).
    public let tagRules: [Int]
    /// Problems found while loading (bad references, unknown ids, invalid regexes).
    public let warnings: [String]
    public let limits: EngineLimits

    /// An empty container (what a container id with no default file starts with).
    public static func empty(limits: EngineLimits = EngineLimits()) -> Container {
        Container(version: "", macros: [], predicates: [], tags: [], rules: [], definitions: [:], rulesForMacro: [:],
                  tagRules: [], warnings: [], limits: limits)
    }

    /// Parses container text: the full form (`{"resource": {...}}`, or the resource object
    /// itself) when it has a `resource`, `macros`, `rules`, `tags` or `predicates` member.
    public static func parse(text: String, limits: EngineLimits = EngineLimits()) throws(ContainerError) -> Container {
        let j: JSON
        do { j = try JSON.parse(text, maxDepth: 256) } catch { throw ContainerError("not valid JSON: \(error.description)") }
        return try parse(full: j, limits: limits)
    }

    /// Parses the legacy `resource` layout.
    public static func parse(full j: JSON, limits: EngineLimits = EngineLimits()) throws(ContainerError) -> Container {
        guard let top = j.objectValue else { throw ContainerError("a container must be a JSON object") }
        let res: JSONObject
        if let r = top["resource"] {
            guard let o = r.objectValue else { throw ContainerError("resource must be a JSON object") }
            res = o
        } else {
            res = top
        }
        var warnings: [String] = []
        func warn(_ s: String) { if warnings.count < 1000 { warnings.append(s) } }
        func section(_ key: String) throws(ContainerError) -> [JSON] {
            guard let v = res[key] else { return [] }
            guard let a = v.arrayValue else { throw ContainerError("\(key) must be an array") }
            guard a.count <= limits.maxEntries else { throw ContainerError("\(key) has \(a.count) entries (limit \(limits.maxEntries))") }
            return a
        }
        let rawMacros = try section("macros")
        let rawPredicates = try section("predicates")
        let rawTags = try section("tags")
        let rawRules = try section("rules")
        let version: String
        switch res["version"] {
        case .string(let s)?: version = s
        case .int(let i)?: version = String(i)
        default: version = ""
        }
        let nMacros = rawMacros.count
        func call(_ j: JSON, _ what: String, _ i: Int) -> FunctionCall {
            parseCall(j, what: "\(what) \(i)", macroCount: nMacros, limits: limits, warn: warn)
        }
        let macros = rawMacros.enumerated().map { call($0.element, "macro", $0.offset) }
        let predicates = rawPredicates.enumerated().map { call($0.element, "predicate", $0.offset) }
        let tags = rawTags.enumerated().map { call($0.element, "tag", $0.offset) }
        for (i, p) in predicates.enumerated() where !p.function.isPredicate {
            warn("predicate \(i): \(p.id.isEmpty ? "no function" : p.id) is not a predicate function (always false)")
        }
        var rules: [Rule] = []
        rules.reserveCapacity(rawRules.count)
        for (ri, raw) in rawRules.enumerated() {
            rules.append(parseRule(raw, index: ri, predicates: predicates.count, tags: tags.count, macros: nMacros, warn: warn))
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
        return Container(version: version, macros: macros, predicates: predicates, tags: tags, rules: rules,
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
            case .array: throw ContainerError("a plain container's value for \"\(k)\" is an array: arrays are not supported at the top level")
            case .null: throw ContainerError("a plain container's value for \"\(k)\" is null: null is not supported at the top level")
            default: break
            }
            defs[k] = [macros.count]
            macros.append(FunctionCall(id: "_c", function: .constant, name: k, negate: false, ignoreCase: false,
                                       notDefaultMacro: false, properties: ["value": .literal(v)], regex: nil, regexError: nil))
        }
        return Container(version: "", macros: macros, predicates: [], tags: [], rules: [], definitions: defs,
                         rulesForMacro: [:], tagRules: [], warnings: [], limits: limits)
    }

    static func flag(_ j: JSON?) -> Bool {
        switch j {
        case .bool(let b)?: return b
        case .string(let s)?: return s.lowercased() == "true"
        case .int(let i)?: return i != 0
        default: return false
        }
    }

    static func parseCall(_ j: JSON, what: String, macroCount: Int, limits: EngineLimits, warn: (String) -> Void) -> FunctionCall {
        guard let o = j.objectValue else {
            warn("\(what) is not an object")
            return FunctionCall(id: "", function: .unknown(""), name: nil, negate: false, ignoreCase: false,
                                notDefaultMacro: false, properties: [:], regex: nil, regexError: nil)
        }
        let id = o["function"]?.stringValue ?? ""
        if id.isEmpty { warn("\(what) has no function id") }
        let fn = FunctionID(id)
        if case .unknown = fn, !id.isEmpty { warn("\(what): \(id) has no backing implementation") }
        var props: [String: TagExpr] = [:]
        for (k, v) in o {
            switch k {
            case "function", "instance_name", "negate", "ignore_case", "not_default_macro": continue
            default: props[k] = TagExpr.parse(v, macroCount: macroCount, warn: { warn("\(what).\(k): \($0)") })
            }
        }
        let ignoreCase = flag(o["ignore_case"])
        var regex: TagRegex?
        var regexError: String?
        let patternKey = fn == .regex ? "arg1" : (fn == .regexGroup ? "arg1" : nil)
        if let patternKey, case .literal(let lit)? = props[patternKey], let pattern = lit.scalarString {
            do { regex = try TagRegex(pattern, ignoreCase: ignoreCase, limits: limits) } catch {
                regexError = error.description
                warn("\(what): \(error.description)")
            }
        }
        var name: String?
        switch o["instance_name"] {
        case .string(let s)?: name = s
        case .int(let i)?: name = String(i)
        default: name = nil
        }
        return FunctionCall(id: id, function: fn, name: name, negate: flag(o["negate"]), ignoreCase: ignoreCase,
                            notDefaultMacro: flag(o["not_default_macro"]), properties: props, regex: regex, regexError: regexError)
    }

    static func parseRule(_ raw: JSON, index ri: Int, predicates: Int, tags: Int, macros: Int, warn: (String) -> Void) -> Rule {
        var r = Rule()
        guard let clauses = raw.arrayValue else {
            warn("rule \(ri) is not an array (never passes)")
            r.broken = true
            return r
        }
        for clause in clauses {
            guard let c = clause.arrayValue, let kind = c.first?.stringValue else {
                warn("rule \(ri): a clause is not [kind, index...] (rule never passes)")
                r.broken = true
                continue
            }
            var idx: [Int] = []
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
            for v in c.dropFirst() {
                guard let i = v.intValue, i >= 0, i < Int64(bound) else {
                    warn("rule \(ri): \(kind) index \(v.serialized) out of range (\(bound))")
                    if kind == "if" || kind == "unless" { r.broken = true }
                    continue
                }
                idx.append(Int(i))
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
