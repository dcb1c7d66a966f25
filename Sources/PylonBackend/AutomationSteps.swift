import PylonCore

/// The steps of a rule (docs/AUTOMATION.md "Steps"): a flat list run from the first, each step
/// leading to the next unless a branch jumps. A branch jumps forward only (to a step with an
/// `id` after it), so every journey ends after at most `steps.count` steps; a send or an exit
/// ends the journey.
extension AutomationRule {
    enum Step: Equatable {
        /// Wait, then go on with the next step.
        case wait(Wait)
        /// Go to `then` when the condition holds, else to `otherwise` (step indexes, after this one).
        case branch(Branch)
        /// Send the push and end the journey.
        case send(Send)
        /// End the journey without a send.
        case exit
    }

    enum Wait: Equatable {
        /// A duration in seconds.
        case seconds(Int64)
        /// Until the next time this minute of the day comes in the user's time zone.
        case until(minuteOfDay: Int)
    }

    struct Branch: Equatable {
        var condition: BranchCondition
        var then: Int
        var otherwise: Int
    }

    enum BranchCondition: Equatable {
        /// A condition on a property of the trigger event (`event.NAME`) or of the user's
        /// profile (`profile.NAME`), as of when the branch runs.
        case property(profile: Bool, Condition)
        /// The user recorded `event` (matching every condition) after the trigger event.
        case did(event: String, conditions: [Condition])
    }

    /// What a send step sends: a push written in the rule, or a stored template by id.
    enum Send: Equatable {
        case push(Push)
        case template(Int64)
    }

    /// An event that ends a journey when the user records it after the trigger (checked before
    /// every step runs).
    struct ExitOn: Equatable {
        var event: String
        var conditions: [Condition] = []
    }

    /// The leading wait in seconds (0: the rule starts with another step): a journey starts
    /// `pending` that long with its next step after the wait.
    var leadingWaitSeconds: Int64 {
        if case .wait(.seconds(let s)) = steps.first { return s }
        return 0
    }

    /// The templates the rule's send steps name.
    var templateIds: [Int64] {
        steps.compactMap {
            if case .send(.template(let id)) = $0 { return id }
            return nil
        }
    }

    // MARK: JSON

    var stepsJSON: JSON {
        var out: [JSON] = []
        func target(_ t: Int, after i: Int) -> JSON? {
            if t == i + 1 && stepIds[t] == nil { return nil }
            return stepIds[t].map(JSON.string)
        }
        for (i, s) in steps.enumerated() {
            var o: JSONObject = [:]
            if let id = stepIds[i] { o["id"] = .string(id) }
            switch s {
            case .wait(.seconds(let n)):
                o["type"] = "wait"
                o["seconds"] = .int(n)
            case .wait(.until(let m)):
                o["type"] = "wait"
                o["until"] = .string(AutomationRule.clock(m))
            case .branch(let b):
                o["type"] = "branch"
                switch b.condition {
                case .property(let profile, let c):
                    var cj = c.json.objectValue ?? [:]
                    cj["property"] = .string((profile ? "profile." : "event.") + c.property)
                    o["if"] = .object(cj)
                case .did(let event, let conditions):
                    o["if"] = ["did": .string(event), "conditions": .array(conditions.map(\.json))]
                }
                if let t = target(b.then, after: i) { o["then"] = t }
                if let t = target(b.otherwise, after: i) { o["else"] = t }
            case .send(.push(let p)):
                o["type"] = "send"
                var pj: JSONObject = ["appId": .string(p.appId), "title": .string(p.title), "body": .string(p.body)]
                if !p.data.isEmpty { pj["data"] = .object(p.data) }
                o["push"] = .object(pj)
            case .send(.template(let id)):
                o["type"] = "send"
                o["template"] = .int(id)
            case .exit:
                o["type"] = "exit"
            }
            out.append(.object(o))
        }
        return .array(out)
    }

    var exitJSON: JSON? {
        exitOn.map { ["event": .string($0.event), "conditions": .array($0.conditions.map(\.json))] }
    }

    // MARK: Parsing

    static func parseExit(_ j: JSON?) throws(AutomationError) -> ExitOn? {
        guard let j, !j.isNull else { return nil }
        guard let o = j.objectValue else { throw AutomationError("exit", "must be {\"event\": NAME, \"conditions\": [...]}") }
        try only(o, ["event", "conditions"], at: "exit")
        let event = try string(o["event"], "exit.event", max: EventIndex.maxFieldBytes)
        return ExitOn(event: event, conditions: try conditions(o["conditions"], at: "exit.conditions"))
    }

    static func conditions(_ j: JSON?, at path: String) throws(AutomationError) -> [Condition] {
        guard let j, !j.isNull else { return [] }
        guard let list = j.arrayValue, list.count <= AutomationLimits.maxConditions else {
            throw AutomationError(path, "must be an array of at most \(AutomationLimits.maxConditions) conditions")
        }
        var out: [Condition] = []
        for (i, c) in list.enumerated() { out.append(try condition(c, at: path + "[\(i)]")) }
        return out
    }

    /// Parses the steps into `rule.steps` and `rule.stepIds`: at most `AutomationLimits.maxSteps`,
    /// ids unique, branches jumping forward to an existing id, a wait or branch never last,
    /// every step reachable, at least one send.
    static func parseSteps(_ j: JSON?, into rule: inout AutomationRule) throws(AutomationError) {
        guard let list = j?.arrayValue, !list.isEmpty else {
            throw AutomationError(
                "steps", "is required: e.g. [{\"type\": \"wait\", \"seconds\": 60}, {\"type\": \"send\", \"push\": {...}}]")
        }
        guard list.count <= AutomationLimits.maxSteps else {
            throw AutomationError("steps", "takes at most \(AutomationLimits.maxSteps) steps")
        }
        // Ids first: a branch may name a later step.
        var ids: [String?] = []
        var index: [String: Int] = [:]
        for (i, s) in list.enumerated() {
            guard let o = s.objectValue else { throw AutomationError("steps[\(i)]", "must be an object with a type") }
            guard let idj = o["id"], !idj.isNull else {
                ids.append(nil)
                continue
            }
            guard let id = idj.stringValue, (1...AutomationLimits.maxStepIdBytes).contains(id.utf8.count),
                id.unicodeScalars.allSatisfy({ $0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "_" || $0 == "-" })
            else {
                throw AutomationError("steps[\(i)].id", "must be 1 to \(AutomationLimits.maxStepIdBytes) letters, digits, _ or -")
            }
            if let k = index[id] { throw AutomationError("steps[\(i)].id", "\"\(id)\" is also the id of steps[\(k)]") }
            index[id] = i
            ids.append(id)
        }
        var steps: [Step] = []
        for (i, s) in list.enumerated() {
            let path = "steps[\(i)]"
            let o = s.objectValue ?? [:]
            let last = i == list.count - 1
            guard let type = o["type"]?.stringValue else {
                throw AutomationError(path + ".type", "is required: wait, branch, send or exit")
            }
            switch type {
            case "wait":
                try only(o, ["id", "type", "seconds", "until"], at: path)
                guard !last else { throw AutomationError(path, "a wait must be followed by a step") }
                let needs = "a wait needs a duration: seconds, an integer in 1...\(AutomationLimits.maxWaitSeconds), or until, a time HH:MM"
                switch (o["seconds"], o["until"]) {
                case (nil, nil): throw AutomationError(path + ".seconds", needs)
                case (.some, .some): throw AutomationError(path, "a wait takes seconds or until, not both")
                case (let sec?, nil):
                    guard let n = sec.intValue, (1...AutomationLimits.maxWaitSeconds).contains(n) else {
                        throw AutomationError(path + ".seconds", "must be an integer in 1...\(AutomationLimits.maxWaitSeconds)")
                    }
                    steps.append(.wait(.seconds(n)))
                case (nil, let u?):
                    guard let m = u.stringValue.flatMap(minutes) else {
                        throw AutomationError(path + ".until", "must be a time of day HH:MM (in the user's time zone)")
                    }
                    steps.append(.wait(.until(minuteOfDay: m)))
                }
            case "branch":
                try only(o, ["id", "type", "if", "then", "else"], at: path)
                let condition = try branchCondition(o["if"], at: path + ".if")
                func target(_ key: String) throws(AutomationError) -> Int {
                    guard let t = o[key], !t.isNull else {
                        guard !last else {
                            throw AutomationError(path + "." + key, "a branch last in the steps needs a step id to go to")
                        }
                        return i + 1
                    }
                    guard let name = t.stringValue, let k = index[name] else {
                        throw AutomationError(
                            path + "." + key, "names no step: a step id (\(ids.compactMap { $0 }.joined(separator: ", ")))")
                    }
                    guard k > i else {
                        throw AutomationError(
                            path + "." + key,
                            "goes back to steps[\(k)] (\"\(name)\"): a loop; a branch jumps forward only")
                    }
                    return k
                }
                steps.append(.branch(Branch(condition: condition, then: try target("then"), otherwise: try target("else"))))
            case "send":
                switch (o["push"], o["template"]) {
                case (let p?, nil):
                    try only(o, ["id", "type", "push"], at: path)
                    steps.append(.send(.push(try push(p, at: path + ".push"))))
                case (nil, let t?):
                    try only(o, ["id", "type", "template"], at: path)
                    guard let id = t.intValue, id > 0 else { throw AutomationError(path + ".template", "must be a template id") }
                    steps.append(.send(.template(id)))
                case (.some, .some): throw AutomationError(path, "a send takes push or template, not both")
                case (nil, nil):
                    throw AutomationError(path + ".push", "is required: {\"appId\", \"title\", \"body\", \"data\"?}, or template: an id")
                }
            case "exit":
                try only(o, ["id", "type"], at: path)
                steps.append(.exit)
            default:
                throw AutomationError(path + ".type", "unknown step type \"\(type)\" (wait, branch, send, exit)")
            }
        }
        // Reachability: the first step, the one after a wait, and a branch's targets.
        var reachable = Array(repeating: false, count: steps.count)
        reachable[0] = true
        for (i, s) in steps.enumerated() where reachable[i] {
            switch s {
            case .wait: reachable[i + 1] = true
            case .branch(let b):
                reachable[b.then] = true
                reachable[b.otherwise] = true
            case .send, .exit: break
            }
        }
        if let i = reachable.firstIndex(of: false) {
            throw AutomationError(
                "steps[\(i)]", "is never reached: a send or an exit ends the journey; give the step an id and let a branch go to it")
        }
        guard steps.contains(where: { if case .send = $0 { return true } else { return false } }) else {
            throw AutomationError("steps", "needs a send step")
        }
        rule.steps = steps
        rule.stepIds = ids
    }

    private static func branchCondition(_ j: JSON?, at path: String) throws(AutomationError) -> BranchCondition {
        guard let o = j?.objectValue else {
            throw AutomationError(
                path,
                "is required: {\"property\": \"profile.NAME\" | \"event.NAME\", \"op\": ..., ...} or {\"did\": EVENT, \"conditions\": [...]}"
            )
        }
        if let did = o["did"] {
            try only(o, ["did", "conditions"], at: path)
            let event = try string(did, path + ".did", max: EventIndex.maxFieldBytes)
            return .did(event: event, conditions: try conditions(o["conditions"], at: path + ".conditions"))
        }
        var c = try condition(j!, at: path)
        let scopes = [("profile.", true), ("event.", false)]
        guard let (prefix, profile) = scopes.first(where: { c.property.hasPrefix($0.0) && c.property.count > $0.0.count }) else {
            throw AutomationError(path + ".property", "must be profile.NAME or event.NAME")
        }
        c.property = String(c.property.dropFirst(prefix.count))
        return .property(profile: profile, c)
    }
}

/// Runs a journey's steps from `step` until one waits, sends or ends it (`AutomationJourney.run`).
/// Pure: what the steps read (the profile, the trigger properties, events since the trigger, the
/// user's time zone, the clock) comes in `Context`.
enum AutomationJourney {
    struct Context {
        var now: Int64
        /// The user's UTC offset in minutes (a wait until a time of day).
        var offsetMinutes: Int
        var event: JSON
        var profile: () -> JSON
        /// Whether the user recorded `event` matching `conditions` after the trigger.
        var did: (_ event: String, _ conditions: [AutomationRule.Condition]) -> Bool
    }

    enum Outcome: Equatable {
        /// Wait until `untilMs`, then go on at `step`.
        case wait(untilMs: Int64, step: Int, reason: String)
        /// Send the push of step `step`.
        case send(step: Int)
        /// End without a send (`exit_event`, `exit_step`).
        case exit(String)
    }

    /// The branches taken on the way (`steps[i].then` / `steps[i].else`) and where the journey stops.
    static func run(_ rule: AutomationRule, from step: Int, _ c: Context) -> (branches: [String], outcome: Outcome) {
        if let x = rule.exitOn, c.did(x.event, x.conditions) { return ([], .exit("exit_event")) }
        var branches: [String] = []
        var i = step
        // Forward only: each turn of this loop moves `i` up.
        while i < rule.steps.count {
            switch rule.steps[i] {
            case .wait(.seconds(let s)): return (branches, .wait(untilMs: c.now + s * 1000, step: i + 1, reason: "wait"))
            case .wait(.until(let m)):
                return (
                    branches, .wait(untilMs: nextTime(m, after: c.now, offsetMinutes: c.offsetMinutes), step: i + 1, reason: "wait_until")
                )
            case .send: return (branches, .send(step: i))
            case .exit: return (branches, .exit("exit_step"))
            case .branch(let b):
                let holds: Bool
                switch b.condition {
                case .property(let profile, let cond): holds = cond.holds(profile ? c.profile() : c.event)
                case .did(let e, let conds): holds = c.did(e, conds)
                }
                branches.append("steps[\(i)]." + (holds ? "then" : "else"))
                i = holds ? b.then : b.otherwise
            }
        }
        return (branches, .exit("exit_step"))
    }

    /// The next time after `now` (UTC ms) that the clock shows `minuteOfDay` at `offsetMinutes`.
    static func nextTime(_ minuteOfDay: Int, after now: Int64, offsetMinutes: Int) -> Int64 {
        let t = AutomationGuard.dayStart(now, offsetMinutes: offsetMinutes) + Int64(minuteOfDay) * 60_000
        return t > now ? t : t + 86_400_000
    }
}
