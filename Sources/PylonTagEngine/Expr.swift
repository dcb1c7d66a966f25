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
    /// Parses a legacy resource value. Arrays whose first element is one of the legacy tags
    /// (`"macro"`, `"template"`, `"list"`, `"map"`, `"escape"`) are those constructs; any other
    /// array is a list; objects are maps with literal keys.
    static func parse(_ j: JSON, macroCount: Int, warn: (String) -> Void) -> TagExpr {
        switch j {
        case .array(let a):
            guard case .string(let tag)? = a.first else {
                return .list(a.map { parse($0, macroCount: macroCount, warn: warn) })
            }
            let rest = a.dropFirst()
            switch tag {
            case "macro":
                guard a.count == 2, let i = a[1].intValue else {
                    warn("bad macro reference \(j.serialized.prefix(80))")
                    return .invalid("bad macro reference")
                }
                guard i >= 0, i < Int64(macroCount) else {
                    warn("macro reference \(i) out of range (\(macroCount) macros)")
                    return .invalid("macro reference \(i) out of range")
                }
                return .macro(Int(i))
            case "template": return .template(rest.map { parse($0, macroCount: macroCount, warn: warn) })
            case "list": return .list(rest.map { parse($0, macroCount: macroCount, warn: warn) })
            case "map":
                var pairs: [TagPair] = []
                var it = rest.makeIterator()
                while let k = it.next() {
                    guard let v = it.next() else { warn("map with an odd number of elements"); break }
                    pairs.append(TagPair(key: parse(k, macroCount: macroCount, warn: warn),
                                         value: parse(v, macroCount: macroCount, warn: warn)))
                }
                return .map(pairs)
            case "escape":
                // The escaping directives only matter for web output; the value is what counts.
                guard a.count >= 2 else { return .invalid("empty escape") }
                return parse(a[1], macroCount: macroCount, warn: warn)
            default:
                return .list(a.map { parse($0, macroCount: macroCount, warn: warn) })
            }
        case .object(let o):
            return .map(o.map { TagPair(key: .literal(.string($0.key)), value: parse($0.value, macroCount: macroCount, warn: warn)) })
        default:
            return .literal(j)
        }
    }
}
