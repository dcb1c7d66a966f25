import CJSONC
import PylonCore

/// A value in a container after indexing: a literal, a reference to a macro (by index, checked
/// at parse time), a list, a map, or a template (the concatenation of its parts' string forms).
public indirect enum TagExpr: Sendable, Equatable {
    case literal(JSON)
    case macro(Int)
    case list([TagExpr])
    case map([TagPair])
    case template([TagExpr])
    /// A reference that could not be resolved at parse time: evaluates to nothing, with the
    /// parse warning already recorded.
    case invalid(String)

    /// True when evaluating needs no context (no macro reference anywhere inside).
    public var isConstant: Bool {
        switch self {
        case .literal: return true
        case .macro, .invalid: return false
        case .list(let a), .template(let a): return a.allSatisfy(\.isConstant)
        case .map(let ps): return ps.allSatisfy { $0.key.isConstant && $0.value.isConstant }
        }
    }
}

public struct TagPair: Sendable, Equatable {
    public var key: TagExpr
    public var value: TagExpr
}

extension TagExpr {
    /// Parses a legacy resource value straight from json-c. Arrays whose first element is one of
    /// the legacy tags (`"macro"`, `"template"`, `"list"`, `"map"`, `"escape"`) are those
    /// constructs; any other array is a list; objects are maps with literal keys.
    static func parse(ref p: OpaquePointer?, macroCount: Int, depth: Int, warn: (String) -> Void) -> TagExpr {
        guard let p else { return .literal(.null) }
        switch json_object_get_type(p) {
        case json_type_array:
            let n = json_object_array_length(p)
            func rest(from s: Int) -> [TagExpr] {
                guard s < n else { return [] }
                return (s..<n).map { parse(ref: json_object_array_get_idx(p, $0), macroCount: macroCount, depth: depth + 1, warn: warn) }
            }
            guard n > 0, let f = json_object_array_get_idx(p, 0), json_object_get_type(f) == json_type_string else {
                return .list(rest(from: 0))
            }
            switch String(cString: json_object_get_string(f)) {
            case "macro":
                guard n == 2, let iv = json_object_array_get_idx(p, 1), json_object_get_type(iv) == json_type_int else {
                    warn("bad macro reference \(JSONRef.toJSON(p).serialized.prefix(80))")
                    return .invalid("bad macro reference")
                }
                let i = json_object_get_int64(iv)
                guard i >= 0, i < Int64(macroCount) else {
                    warn("macro reference \(i) out of range (\(macroCount) macros)")
                    return .invalid("macro reference \(i) out of range")
                }
                return .macro(Int(i))
            case "template": return .template(rest(from: 1))
            case "list": return .list(rest(from: 1))
            case "map":
                let parts = rest(from: 1)
                if parts.count % 2 == 1 { warn("map with an odd number of elements") }
                var pairs: [TagPair] = []
                var i = 0
                while i + 1 < parts.count {
                    pairs.append(TagPair(key: parts[i], value: parts[i + 1]))
                    i += 2
                }
                return .map(pairs)
            case "escape":
                guard n >= 2 else { return .invalid("empty escape") }
                return parse(ref: json_object_array_get_idx(p, 1), macroCount: macroCount, depth: depth + 1, warn: warn)
            default:
                return .list(rest(from: 0))
            }
        case json_type_object:
            var pairs: [TagPair] = []
            var it = json_object_iter_begin(p)
            var end = json_object_iter_end(p)
            while json_object_iter_equal(&it, &end) == 0 {
                let k = String(cString: json_object_iter_peek_name(&it))
                pairs.append(
                    TagPair(
                        key: .literal(.string(k)),
                        value: parse(ref: json_object_iter_peek_value(&it), macroCount: macroCount, depth: depth + 1, warn: warn)))
                json_object_iter_next(&it)
            }
            return .map(pairs)
        default:
            return .literal(JSONRef.toJSON(p))
        }
    }
}
