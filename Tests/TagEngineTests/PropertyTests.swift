import PylonCore
import Testing

@testable import PylonTagEngine

/// Random containers and data layers (seeded SplitMix64, so a failure reproduces) never crash
/// or hang the engine.
@Suite struct PropertyTests {
    struct Gen {
        var rng: SplitMix64
        mutating func int(_ n: Int) -> Int { Int(rng.next() % UInt64(max(1, n))) }
        mutating func pick<T>(_ a: [T]) -> T { a[int(a.count)] }
        static let ids = [
            "_eq", "_cn", "_sw", "_ew", "_re", "_lt", "_le", "_gt", "_ge", "_c", "_v", "_e", "_an", "_av", "_ai", "_l",
            "_ov", "_p", "_dn", "_dt", "_r", "_t", "_rs", "_ctv", "_sv", "_rv", "_func", "_jn", "_smm", "_reg",
            "_enc", "_hsh", "_ua", "_img", "_bogus", "",
        ]
        static let keys = [
            "arg0", "arg1", "value", "name", "default_value", "additional_params", "function_call_macro_name",
            "map", "group", "item_separator", "algorithm", "input_format", "output_format", "key_value_separator",
        ]
        static let patterns = ["(a+)+$", "^x", "[", "(?i)ab", "\\d+", "(a|aa)+b", ".*.*.*=", ""]

        mutating func scalar() -> JSON {
            switch int(7) {
            case 0: return .int(Int64(int(2000)) - 1000)
            case 1: return .double(Double(int(1000)) / 7)
            case 2: return .bool(int(2) == 0)
            case 3: return .null
            case 4: return .string(pick(Gen.patterns))
            case 5: return .string(pick(["a", "aaaaaaaaaaaaaaaaaaaaaaaaa!", "1", "true", "e", "x.y", "", "openScreen"]))
            default: return .string(String(repeating: "a", count: int(40)))
            }
        }

        mutating func value(_ macros: Int, depth: Int = 0) -> JSON {
            if depth > 3 { return scalar() }
            switch int(9) {
            case 0, 1: return ["macro", .int(Int64(int(macros + 3)) - 1)]  // sometimes out of range
            case 2: return .array(["template"] + (0..<int(4)).map { _ in value(macros, depth: depth + 1) })
            case 3: return .array(["list"] + (0..<int(4)).map { _ in value(macros, depth: depth + 1) })
            case 4: return .array(["map"] + (0..<int(5)).map { _ in value(macros, depth: depth + 1) })
            case 5:
                var o = JSONObject()
                for _ in 0..<int(3) { o[pick(["key", "value", "a", "b"])] = value(macros, depth: depth + 1) }
                return .object(o)
            case 6: return ["macro"]
            default: return scalar()
            }
        }

        mutating func call(_ macros: Int, names: [String]) -> JSON {
            if int(30) == 0 { return scalar() }
            var o: JSONObject = ["function": .string(pick(Gen.ids))]
            if int(4) != 0 { o["instance_name"] = .string(pick(names)) }
            for _ in 0..<int(5) { o[pick(Gen.keys)] = value(macros) }
            if int(3) == 0 { o["arg1"] = .string(pick(Gen.patterns)) }
            if int(4) == 0 { o["negate"] = true }
            if int(4) == 0 { o["ignore_case"] = true }
            if int(3) == 0 { o["not_default_macro"] = true }
            return .object(o)
        }

        mutating func container() -> JSON {
            let names = (0..<max(1, int(8))).map { "n\($0)" }
            let nm = int(25), np = int(20), nt = int(10), nr = int(15)
            let macros = (0..<nm).map { _ in call(nm, names: names) }
            let preds = (0..<np).map { _ in call(nm, names: names) }
            let tags = (0..<nt).map { _ in call(nm, names: names) }
            var rules: [JSON] = []
            for _ in 0..<nr {
                var clauses: [JSON] = []
                for _ in 0..<int(5) {
                    let kind = pick(["if", "unless", "add", "block", "add_macro", "block_macro", "bogus"])
                    clauses.append(.array([.string(kind)] + (0..<int(3)).map { _ in .int(Int64(int(25)) - 2) }))
                }
                rules.append(int(20) == 0 ? scalar() : .array(clauses))
            }
            return [
                "resource": [
                    "version": "r", "macros": .array(macros), "predicates": .array(preds), "tags": .array(tags), "rules": .array(rules),
                ]
            ]
        }

        mutating func dataLayer() -> JSONObject {
            var o = JSONObject()
            for _ in 0..<int(6) { o[pick(["a", "b", "x.y", "event", "screenName", "key"])] = value(0) }
            return o
        }
    }

    @Test func randomContainersNeverCrashOrHang() throws {
        var g = Gen(rng: SplitMix64(seed: 0x5EED))
        var limits = EngineLimits()
        limits.maxSteps = 20_000
        // How long the 400 take is `Benchmarks/engine-worst-cases.sh`'s to say (a 60 s bound here
        // before); here, that they were evaluated at all.
        var parsed = 0
        for round in 0..<400 {
            let j = g.container()
            guard let c = try? Container.parse(full: j, limits: limits) else { continue }
            parsed += 1
            var dl = DataLayer()
            for _ in 0..<3 { dl.push(g.dataLayer()) }
            var cx = EvaluationContext(dataLayer: dl, event: "openScreen", nowMs: 1, seed: UInt64(round), registeredMacros: ["f"])
            for name in c.definitions.keys.sorted() + ["missing"] {
                let e = c.value(named: name, context: cx)
                for t in ValueType.allCases { _ = e.converted(to: t) }
                for p in e.pending { cx.functionResults[p.key] = .null }
            }
            _ = c.tagsToFire(context: cx)
            cx.event = nil
            _ = c.tagsToFire(context: cx)
        }
        #expect(parsed == 400, "bad entries are warnings, not refusals: \(parsed) of 400 parsed")
    }

    @Test func randomPushesNeverCrash() {
        var g = Gen(rng: SplitMix64(seed: 77))
        var dl = DataLayer()
        var checked = 0
        for _ in 0..<2000 {
            let update = g.dataLayer()
            dl.push(update)
            _ = dl.get(g.pick(["a", "b", "x.y", "x", "a.b.c", ""]))
            // A scalar pushed under a plain key overwrites (unless a dotted key of the same push
            // expands into it).
            for (k, v) in update where !k.contains(".") && !update.keys.contains(where: { $0.hasPrefix(k + ".") }) {
                switch v {
                case .object, .array: continue
                default:
                    #expect(dl.get(k) == v, "\(k) after \(JSON.object(update).serialized)")
                    checked += 1
                }
            }
        }
        #expect(checked > 500, "scalar overwrites checked: \(checked)")
    }
}
