import PylonCore

extension Container {
    /// Evaluates the macro named `name` (what `gtm.getValue` serves): selects the enabled
    /// definition by its rules, then evaluates it.
    public func value(named name: String, context: EvaluationContext) -> Evaluation {
        let e = Evaluator(self, context)
        var v = e.valueOf(name: name)
        if e.stop == nil, let x = v, TagConversion.jsonSize(x, limit: limits.maxValueBytes) == nil {
            e.stopValue("the value of \(name.prefix(64)) is larger than \(limits.maxValueBytes) bytes as JSON")
        }
        if e.stop != nil { v = nil }
        return Evaluation(value: v, warnings: e.warnings, pending: e.stop == nil ? e.pendingList : [], stop: e.stop)
    }

    /// The tags that fire for the event `context.event`: the union of the passing rules' `add`
    /// tags minus the union of their `block` tags, in tag index order, properties evaluated.
    public func tagsToFire(context: EvaluationContext) -> TagEvaluation {
        let e = Evaluator(self, context)
        var add = Set<Int>()
        var block = Set<Int>()
        for ri in tagRules where e.rulePasses(ri) {
            add.formUnion(rules[ri].addTags)
            block.formUnion(rules[ri].blockTags)
        }
        var out: [TagFiring] = []
        for ti in add.subtracting(block).sorted() {
            let t = tags[ti]
            var props = JSONObject()
            for k in t.properties.keys.sorted() { props[k] = e.eval(t.properties[k]!) ?? .null }
            if let n = t.name { props["instance_name"] = .string(n) }
            if case .unknown(let id) = t.function { e.warn("tag \(ti): \(id.isEmpty ? "no function" : id) has no backing implementation") }
            if e.stop != nil { break }
            guard TagConversion.jsonSize(.object(props), limit: limits.maxValueBytes) != nil else {
                e.warn("tag \(ti) not fired: its properties are larger than \(limits.maxValueBytes) bytes as JSON")
                continue
            }
            out.append(TagFiring(index: ti, function: t.function, functionId: t.id, properties: props))
        }
        if e.stop != nil { return TagEvaluation(tags: [], warnings: e.warnings, pending: [], stop: e.stop) }
        return TagEvaluation(tags: out, warnings: e.warnings, pending: e.pendingList)
    }

    /// Whether rule `index` passes (for tests and debugging).
    public func rulePasses(_ index: Int, context: EvaluationContext) -> Bool {
        Evaluator(self, context).rulePasses(index)
    }

    /// The value of predicate `index` (for tests and debugging).
    public func predicateValue(_ index: Int, context: EvaluationContext) -> (Bool, [String]) {
        let e = Evaluator(self, context)
        let r = e.predicate(index)
        return (r, e.warnings)
    }
}

/// One evaluation: caches for this evaluation only (predicates, rules, macro values), the work
/// and depth budgets, cycle detection and the warnings. Never traps on container content.
final class Evaluator {
    let c: Container
    let ctx: EvaluationContext
    private(set) var warnings: [String] = []
    private var warned = Set<String>()
    private var pending: [FunctionCallRequest] = []
    private var pendingKeys = Set<String>()
    private var steps = 0
    /// Bytes produced and hashed so far (`maxWorkBytes`).
    private var bytes = 0
    private var exhausted = false
    /// The limit that stopped this evaluation, if one did.
    private(set) var stop: EvaluationStop?
    /// Frames of `inProgress` from this index up are in a reference cycle (or past the depth
    /// limit): their values are unresolved, whatever they had built.
    private var poisonFrom: Int?
    private var depth = 0
    /// Name ids being evaluated (an unnamed macro i is -(i + 1)).
    /// A stack, not a set: it is at most `maxDepth` deep, and most evaluations never allocate one.
    private var inProgress: [Int] = []
    private var macroCache: [Int: JSON?] = [:]
    /// 0 = not evaluated, 1 = false, 2 = true; allocated on first use.
    private var predCache: [UInt8] = []
    private var ruleCache: [UInt8] = []
    private var rng: SplitMix64

    init(_ c: Container, _ ctx: EvaluationContext) {
        self.c = c
        self.ctx = ctx
        rng = SplitMix64(seed: ctx.seed)
    }

    var pendingList: [FunctionCallRequest] { pending }

    func warn(_ s: String) {
        guard warned.count < c.limits.maxWarnings, !warned.contains(s) else { return }
        warned.insert(s)
        warnings.append(s)
    }

    /// Counts one unit of work; false once the budget is spent.
    private func step() -> Bool {
        if exhausted { return false }
        steps += 1
        if steps > c.limits.maxSteps {
            exhausted = true
            stop = .steps
            warn("evaluation stopped: work limit of \(c.limits.maxSteps) steps reached")
            return false
        }
        return true
    }

    /// Counts `n` bytes produced or hashed; false once `maxWorkBytes` is spent.
    private func charge(_ n: Int) -> Bool {
        if exhausted { return false }
        bytes += n
        if bytes > c.limits.maxWorkBytes {
            exhausted = true
            stop = .workBytes
            warn("evaluation stopped: work limit of \(c.limits.maxWorkBytes) bytes produced and hashed reached")
            return false
        }
        return true
    }

    /// Stops the evaluation because its value is too large.
    func stopValue(_ why: String) {
        exhausted = true
        stop = .valueBytes
        warn(why)
    }

    /// The string form of `v` (`TagConversion.toString`) with its bytes charged; "" once the
    /// budget is spent. A list or map is measured (bounded) before it is serialised.
    private func str(_ v: JSON?) -> String {
        if exhausted { return "" }
        switch v {
        case .array?, .object?:
            guard TagConversion.jsonSize(v!, limit: max(0, c.limits.maxWorkBytes - bytes)) != nil else {
                _ = charge(c.limits.maxWorkBytes + 1)
                return ""
            }
        default: break
        }
        let s = TagConversion.toString(v)
        return charge(s.utf8.count) ? s : ""
    }

    // MARK: Macros

    func valueOf(name: String) -> JSON? {
        guard let id = c.nameIndex[name] else {
            guard step() else { return nil }
            warn("Invalid macro: \(name)")
            return nil
        }
        return valueOf(nameId: id)
    }

    func valueOf(nameId id: Int) -> JSON? {
        guard step() else { return nil }
        if let cached = macroCache[id] { return cached }
        let name = c.names[id]
        var random = false
        let (v, poisoned) = entering(id, label: name) { () -> JSON? in
            guard let idx = select(name, c.definitionsById[id]) else { return nil }
            random = c.macros[idx].function == .random
            return evalMacro(idx)
        }
        // Only scalars are cached: a list or map is rebuilt on each use, so every node of a
        // produced value costs a step and the work limit bounds its size (a macro listing the
        // previous one twice, thirty times over, cannot build 2^30 nodes through the cache).
        if !poisoned, !exhausted, !random, !v.isCompound { macroCache[id] = .some(v) }
        return v
    }

    /// Runs `body` for macro `key` (a name id, or a negative definition key) unless that would
    /// close a reference cycle or nest deeper than the limit: then one warning and no value.
    /// A macro in a cycle is unresolved however the cycle is reached (directly, through a
    /// template, a list, a map, an argument): every frame from the one the cycle returns to up
    /// is poisoned, so none of them keeps what it had built. Past the depth limit every frame
    /// is (a ring longer than the limit is a cycle the stack cannot show). `poisoned` is true
    /// for a frame whose value was dropped.
    private func entering(_ key: Int, label: String, _ body: () -> JSON?) -> (JSON?, poisoned: Bool) {
        if let j = inProgress.firstIndex(of: key) {
            warn("Macro cycle detected: \(label)")
            poisonFrom = min(poisonFrom ?? j, j)
            return (nil, true)
        }
        guard depth < c.limits.maxDepth else {
            warn("macro nesting deeper than \(c.limits.maxDepth) at \(label)")
            poisonFrom = 0
            return (nil, true)
        }
        let frame = inProgress.count
        depth += 1
        inProgress.append(key)
        let v = body()
        inProgress.removeLast()
        depth -= 1
        if let p = poisonFrom, frame >= p {
            if frame == p { poisonFrom = nil }
            return (nil, true)
        }
        return (v, false)
    }

    /// A `["macro", i]` reference: the macro's name when it has one (so its rules choose among
    /// its definitions), else that definition itself.
    func valueOf(index i: Int) -> JSON? {
        let id = c.nameIds[i]
        if id >= 0 { return valueOf(nameId: id) }
        guard step() else { return nil }
        // Unnamed definitions are cached like named ones (scalars only, never `_r`): an unnamed
        // `_hsh` listed 30,000 times is hashed once.
        let key = -(i + 1)
        if let cached = macroCache[key] { return cached }
        let (v, poisoned) = entering(key, label: "macro \(i)") { evalMacro(i) }
        if !poisoned, !exhausted, c.macros[i].function != .random, !v.isCompound { macroCache[key] = .some(v) }
        return v
    }

    /// The enabled definition: `add_macro` of passing rules minus `block_macro`; none → the
    /// definition without `not_default_macro`; several → the lowest index, with a warning.
    func select(_ name: String, _ defs: [Int]) -> Int? {
        var enabled: [Int] = []
        for d in defs {
            let rs = c.rulesForMacro[d]
            if rs.isEmpty { continue }
            var added = false
            var blocked = false
            for ri in rs where rulePasses(ri) {
                if c.rules[ri].addMacros.contains(d) { added = true }
                if c.rules[ri].blockMacros.contains(d) { blocked = true }
            }
            if added && !blocked { enabled.append(d) }
        }
        if enabled.count > 1 {
            warn("Multiple macros active for macroName \(name): using definition \(enabled[0]) (the lowest index)")
        }
        if let first = enabled.first { return first }
        let defaults = defs.filter { !c.macros[$0].notDefaultMacro }
        if defaults.count > 1 {
            warn("Multiple default definitions for macroName \(name): using definition \(defaults[0]) (the lowest index)")
        }
        return defaults.first
    }

    private func require(_ m: FunctionCall, _ keys: String...) -> Bool {
        for k in keys where m.properties[k] == nil {
            warn("Incorrect keys for function \(m.id)\(m.name.map { " (\($0))" } ?? ""): \(k) is required")
            return false
        }
        return true
    }

    private func env(_ s: String) -> JSON? { s.isEmpty ? nil : .string(s) }

    func evalMacro(_ i: Int) -> JSON? {
        guard step() else { return nil }
        let m = c.macros[i]
        let e = ctx.environment
        switch m.function {
        case .constant:
            guard let v = m.value else {
                _ = require(m, "value")
                return nil
            }
            return eval(v)
        case .dataLayer:
            guard require(m, "name") else { return nil }
            let path = str(eval(m["name"]!))
            if let v = ctx.dataLayer.get(path), v != .null { return v }
            return m["default_value"].flatMap { eval($0) }
        case .event: return ctx.event.map { .string($0) }
        case .appName: return env(e.appName)
        case .appVersion: return env(e.appVersion)
        case .appId: return env(e.appId)
        case .language: return env(e.language.lowercased())
        case .osVersion: return env(e.osVersion)
        case .platform: return env(e.platform)
        case .deviceName: return env(e.deviceName)
        case .deviceType: return env(e.deviceType)
        case .resolution: return env(e.resolution)
        case .sdkVersion: return env(e.sdkVersion)
        case .runtimeVersion: return env(e.runtimeVersion)
        case .containerVersion: return .string(c.version)
        case .random: return .int(Int64(rng.next() % 0x7FFF_FFFF))  // 0 ... 2^31-2
        case .time: return .int(ctx.nowMs)
        case .functionCall: return functionCall(m)
        case .joiner: return joiner(m)
        case .simpleMap: return simpleMap(m)
        case .regexGroup: return regexGroup(m)
        case .encode: return encode(m)
        case .hash: return hash(m)
        case .unknown(let id):
            warn(id.isEmpty ? "macro \(i) has no function id" : "\(id) has no backing implementation")
            return nil
        default:
            warn("\(m.id) is not a macro function (macro \(i))")
            return nil
        }
    }

    private func functionCall(_ m: FunctionCall) -> JSON? {
        guard require(m, "function_call_macro_name") else { return nil }
        let name = str(eval(m["function_call_macro_name"]!))
        var params = JSON.object([:])
        if let p = m["additional_params"] {
            guard let v = eval(p), case .object = v else {
                warn("additional_params of function-call macro \(name) is not a map")
                return nil
            }
            params = v
        }
        guard TagConversion.jsonSize(params, limit: c.limits.maxValueBytes) != nil else {
            warn("additional_params of function-call macro \(name) are larger than \(c.limits.maxValueBytes) bytes as JSON")
            return nil
        }
        let req = FunctionCallRequest(name: name, parameters: params)
        if let answer = ctx.functionResults[req.key] { return answer == .null ? nil : answer }
        guard ctx.registeredMacros.contains(name) else {
            warn("No function-call macro handler registered for \(name)")
            return nil
        }
        if pendingKeys.insert(req.key).inserted { pending.append(req) }
        return nil
    }

    private func joiner(_ m: FunctionCall) -> JSON? {
        guard require(m, "arg0") else { return nil }
        guard let v = eval(m["arg0"]!) else { return nil }
        let sep = m["item_separator"].flatMap { eval($0) }.map { str($0) } ?? ","
        let kv = m["key_value_separator"].flatMap { eval($0) }.map { str($0) } ?? "="
        switch v {
        case .array(let a):
            guard charge(sep.utf8.count * a.count) else { return nil }
            let s = cap(a.map { str($0) }.joined(separator: sep))
            return exhausted ? nil : .string(s)
        case .object(let o):
            guard charge((sep.utf8.count + kv.utf8.count) * o.count) else { return nil }
            let s = cap(o.map { str(.string($0.key)) + kv + str($0.value) }.joined(separator: sep))
            return exhausted ? nil : .string(s)
        default: return .string(str(v))
        }
    }

    private func simpleMap(_ m: FunctionCall) -> JSON? {
        guard require(m, "arg0", "map") else { return nil }
        let input = str(eval(m["arg0"]!))
        switch eval(m["map"]!) {
        case .object(let o)?:
            if let v = o[input] { return v }
        case .array(let a)?:
            for entry in a where str(entry["key"]) == input { return entry["value"] }
        default:
            warn("map of \(m.id) is not a map or a list of {key, value}")
        }
        return m["default_value"].flatMap { eval($0) }
    }

    private func regexGroup(_ m: FunctionCall) -> JSON? {
        guard require(m, "arg0", "arg1") else { return nil }
        guard let input = eval(m["arg0"]!) else { return nil }
        guard let re = regex(m) else { return nil }
        let group = m["group"].flatMap { eval($0) }.flatMap { TagConversion.toInt64($0) } ?? 1
        let subject = str(input)
        guard subject.utf8.count <= c.limits.maxRegexSubjectBytes else {
            warn("regex subject exceeds \(c.limits.maxRegexSubjectBytes) bytes")
            return nil
        }
        if let g = re.group(Int(clamping: group), in: subject) { return .string(g) }
        return m["default_value"].flatMap { eval($0) }
    }

    private func encode(_ m: FunctionCall) -> JSON? {
        guard require(m, "arg0") else { return nil }
        guard let v = eval(m["arg0"]!) else { return nil }
        guard let bytes = inputBytes(m, v) else { return nil }
        return output(m, bytes, defaultFormat: "base16")
    }

    private func hash(_ m: FunctionCall) -> JSON? {
        guard require(m, "arg0") else { return nil }
        guard let v = eval(m["arg0"]!) else { return nil }
        guard let bytes = inputBytes(m, v) else { return nil }
        let alg = m["algorithm"].flatMap { eval($0) }.map { str($0).uppercased() } ?? "MD5"
        let digest: [UInt8]
        switch alg {
        case "MD5": digest = Digest.md5(bytes)
        case "SHA-1", "SHA1": digest = Digest.sha1(bytes)
        case "SHA-256", "SHA256": digest = Digest.sha256(bytes)
        default:
            warn("\(m.id): unknown algorithm \(alg)")
            return nil
        }
        return output(m, digest, defaultFormat: "base16")
    }

    private func inputBytes(_ m: FunctionCall, _ v: JSON) -> [UInt8]? {
        let s = str(v)
        guard !exhausted else { return nil }
        let f = m["input_format"].flatMap { eval($0) }.map { str($0) } ?? "text"
        switch f {
        case "text": return Array(s.utf8)
        case "base16":
            guard let b = Digest.fromHex(s) else { warn("\(m.id): input is not base16"); return nil }
            return b
        default:
            warn("\(m.id): unknown input_format \(f)")
            return nil
        }
    }

    private func output(_ m: FunctionCall, _ b: [UInt8], defaultFormat: String) -> JSON? {
        let f = m["output_format"].flatMap { eval($0) }.map { str($0) } ?? defaultFormat
        switch f {
        case "base16": return .string(Digest.hex(b))
        case "base64": return .string(Digest.base64(b, url: false, pad: true))
        case "base64url": return .string(Digest.base64(b, url: true, pad: true))
        case "base64nopad": return .string(Digest.base64(b, url: false, pad: false))
        default:
            warn("\(m.id): unknown output_format \(f)")
            return nil
        }
    }

    private func cap(_ s: String) -> String {
        guard s.utf8.count > c.limits.maxStringBytes else { return s }
        warn("string cut at \(c.limits.maxStringBytes) bytes")
        return String(decoding: s.utf8.prefix(c.limits.maxStringBytes), as: UTF8.self)
    }

    // MARK: Values

    func eval(_ x: TagExpr) -> JSON? {
        guard step() else { return nil }
        switch x {
        case .literal(let j): return j == .null ? nil : j
        case .macro(let i): return valueOf(index: i)
        case .invalid: return nil
        case .list(let a): return .array(a.map { eval($0) ?? .null })
        case .map(let ps):
            var o = JSONObject()
            for p in ps { o[str(eval(p.key))] = eval(p.value) ?? .null }
            return .object(o)
        case .template(let parts):
            var s = ""
            for p in parts {
                s += str(eval(p))
                if s.utf8.count > c.limits.maxStringBytes { return .string(cap(s)) }
            }
            return .string(s)
        }
    }

    // MARK: Predicates and rules

    /// A rule passes iff no `unless` predicate is true and every `if` predicate is true;
    /// the negatives are evaluated first and evaluation stops at the first decisive one.
    func rulePasses(_ ri: Int) -> Bool {
        if ruleCache.isEmpty { ruleCache = [UInt8](repeating: 0, count: c.rules.count) }
        if ruleCache[ri] != 0 { return ruleCache[ri] == 2 }
        guard step() else { return false }
        var pass = !c.rules[ri].broken
        if pass {
            for n in c.rules[ri].negative where predicate(n) { pass = false; break }
        }
        if pass {
            for p in c.rules[ri].positive where !predicate(p) { pass = false; break }
        }
        ruleCache[ri] = pass ? 2 : 1
        return pass
    }

    func predicate(_ i: Int) -> Bool {
        if predCache.isEmpty { predCache = [UInt8](repeating: 0, count: c.predicates.count) }
        if predCache[i] != 0 { return predCache[i] == 2 }
        let r = computePredicate(i)
        predCache[i] = r ? 2 : 1
        return r
    }

    /// An unresolved argument makes the predicate false, `negate` or not.
    private func computePredicate(_ i: Int) -> Bool {
        guard step() else { return false }
        let p = c.predicates[i]
        guard p.function.isPredicate else { return false }
        guard let arg0 = p.arg0, let arg1 = p.arg1 else {
            _ = require(p, "arg0", "arg1")
            return false
        }
        guard let a = eval(arg0), let b = eval(arg1) else { return false }
        let r: Bool
        switch p.function {
        case .equals, .contains, .startsWith, .endsWith:
            var sa = str(a)
            var sb = str(b)
            if exhausted { return false }
            if p.ignoreCase {
                sa = sa.lowercased()
                sb = sb.lowercased()
            }
            switch p.function {
            case .equals: r = sa == sb
            case .contains: r = sb.isEmpty || sa.utf8.firstRange(of: sb.utf8) != nil
            case .startsWith: r = sa.utf8.starts(with: sb.utf8)
            default: r = sa.utf8.count >= sb.utf8.count && sa.utf8.suffix(sb.utf8.count).elementsEqual(sb.utf8)
            }
        case .regex:
            guard let re = regex(p) else { return false }
            let subject = str(a)
            if exhausted { return false }
            guard subject.utf8.count <= c.limits.maxRegexSubjectBytes else {
                warn("regex subject exceeds \(c.limits.maxRegexSubjectBytes) bytes (predicate \(i) false)")
                return false
            }
            switch re.matches(subject) {
            case .match: r = true
            case .noMatch: r = false
            case .failed(let why):
                warn("regex /\(re.pattern.prefix(40))/ gave up: \(why) (predicate \(i) false)")
                return false
            }
        default:
            guard let na = TagConversion.number(a), let nb = TagConversion.number(b) else { return false }
            let cmp: Int
            if case .int(let x) = na, case .int(let y) = nb {
                cmp = x < y ? -1 : (x > y ? 1 : 0)
            } else {
                let x = na.double, y = nb.double
                cmp = x < y ? -1 : (x > y ? 1 : 0)
            }
            switch p.function {
            case .lessThan: r = cmp < 0
            case .lessEqual: r = cmp <= 0
            case .greaterThan: r = cmp > 0
            default: r = cmp >= 0
            }
        }
        return p.negate ? !r : r
    }

    /// The compiled pattern: the one compiled at load, or (for a computed pattern) compiled now.
    private func regex(_ f: FunctionCall) -> TagRegex? {
        if let re = f.regex { return re }
        if f.regexError != nil { return nil }
        guard let pv = eval(f["arg1"]!) else { return nil }
        do {
            return try TagRegex(str(pv), ignoreCase: f.ignoreCase, limits: c.limits)
        } catch {
            warn("\(f.id): \(error.description)")
            return nil
        }
    }
}

extension Optional where Wrapped == JSON {
    var isCompound: Bool {
        switch self {
        case .array?, .object?: return true
        default: return false
        }
    }
}
