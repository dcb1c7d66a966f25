import PylonCore

/// The automation send path (docs/AUTOMATION.md "How it runs"): a journey's steps run with what
/// they read from the store, the user's time zone, the push rendered and sent through the admin
/// push path, and the members of one-off segment sends.
extension Backend {
    /// The push a send step sends: its own, or the stored template's (nil: the template is gone).
    func sendPush(_ content: AutomationRule.Send) throws(StoreError) -> AutomationRule.Push? {
        switch content {
        case .push(let p): return p
        case .template(let id):
            guard let row = try store.automationObject(.template, id), let j = try? JSON.parse(row.definition) else { return nil }
            return try? PushTemplate.parse(j).push
        }
    }

    /// The user's UTC offset in minutes at `now`: the time zone in the profile property the rule
    /// names (`AutomationTimeZone`), else the rule's `utcOffsetMinutes`.
    func userOffsetMinutes(_ a: AutomationState, _ rule: AutomationRule, appKey: String, euid: String, now: Int64) throws(StoreError)
        -> Int
    {
        let text = try store.automationProfile(appKey: appKey, euid: euid)
        let profile = (try? JSON.parse(text)) ?? .null
        let zone = { (name: String) -> TZif? in
            if let z = a.zones[name] { return z }
            let z = AutomationTimeZone.load(name)
            if a.zones.count < AutomationLimits.maxCachedZones { a.zones[name] = z }
            return z
        }
        return AutomationTimeZone.offsetMinutes(profile[rule.guards.timeZoneProperty], now: now, zone: zone)
            ?? rule.guards.utcOffsetMinutes
    }

    /// Runs the journey's steps from its `step` (`AutomationJourney.run`) with what they read
    /// from the store: the profile, events since the trigger, the user's time zone.
    func runSteps(_ j: Store.JourneyRow, _ rule: AutomationRule, now: Int64) throws(StoreError) -> (
        branches: [String], outcome: AutomationJourney.Outcome
    ) {
        var failure: StoreError?
        var profile: JSON?
        let offset = try automation.map { a throws(StoreError) in try userOffsetMinutes(a, rule, appKey: j.appKey, euid: j.euid, now: now) }
        let context = AutomationJourney.Context(
            now: now, offsetMinutes: offset ?? rule.guards.utcOffsetMinutes, event: (try? JSON.parse(j.properties)) ?? .object([:]),
            profile: {
                if let p = profile { return p }
                do throws(StoreError) {
                    let text = try self.store.automationProfile(appKey: j.appKey, euid: j.euid)
                    profile = (try? JSON.parse(text)) ?? .object([:])
                } catch {
                    failure = error
                    profile = .object([:])
                }
                return profile!
            },
            did: { event, conditions in
                do throws(StoreError) {
                    return try self.store.automationEventsSince(appKey: j.appKey, euid: j.euid, event: event, afterId: j.eventId)
                        .contains { p in conditions.allSatisfy { $0.holds(p) } }
                } catch {
                    failure = error
                    return false
                }
            })
        let result = AutomationJourney.run(rule, from: j.step, context)
        if let failure { throw failure }
        return result
    }

    /// Renders the journey's push and sends it through `POST /v1/admin/push/send`'s path
    /// (history, funnel, republish), with `automation:<journey id>` as its dedup key.
    func send(_ a: AutomationState, _ j: Store.JourneyRow, _ rule: AutomationRule, now: Int64) throws(StoreError) {
        guard let userId = try store.automationUserId(appKey: j.appKey, euid: j.euid) else {
            try store.suppressJourney(j, reason: "no_binding", now: now)
            return
        }
        guard j.step < rule.steps.count, case .send(let content) = rule.steps[j.step], let push = try sendPush(content) else {
            try store.suppressJourney(j, reason: "template_missing", now: now)
            return
        }
        let answer = try sendRendered(
            push, appKey: j.appKey, euid: j.euid, userId: userId, event: (try? JSON.parse(j.properties)) ?? .object([:]),
            msgKey: "automation:" + String(j.id), actor: "automation rule " + String(j.ruleId))
        switch answer {
        case .success(let r):
            guard let msgId = r.body["msgId"]?.stringValue else {
                try store.suppressJourney(j, reason: "send_failed", now: now)
                return
            }
            try store.finishJourney(j, msgId: msgId, now: now)
            a.sent += 1
        case .failure(let e) where e.status >= 500:
            // The broker is not connected (or the database is busy): the journey is due again
            // shortly, and its guards are checked again then.
            try store.postponeJourney(j, untilMs: now + AutomationLimits.retryAfterMs, reason: "retry", log: false, now: now)
        case .failure(let e):
            log.warn("automation: send refused", ["journey": j.id, "error": e.message])
            try store.suppressJourney(j, reason: "send_failed", now: now)
        }
    }

    /// Renders `push` for the user (profile as of now, `event` the trigger's properties) and
    /// sends it through `POST /v1/admin/push/send`'s path (history, funnel, republish) to user
    /// `userId` with dedup key `msgKey`.
    func sendRendered(
        _ push: AutomationRule.Push, appKey: String, euid: String, userId: String, event: JSON, msgKey: String, actor: String
    ) throws(StoreError) -> Result<HTTPResponse, APIError> {
        let text = try store.automationProfile(appKey: appKey, euid: euid)
        let profile = (try? JSON.parse(text)) ?? .object([:])
        func render(_ s: String, _ max: Int) -> JSON {
            .string(AutomationTemplate.cut(AutomationTemplate.render(s, event: event, profile: profile), max))
        }
        var body: JSONObject = [
            "appId": .string(push.appId), "targetType": "user", "target": .string(userId),
            "title": render(push.title, PushLimits.maxTitleBytes), "content": render(push.body, PushLimits.maxContentBytes),
            "msgKey": .string(msgKey),
        ]
        if !push.data.isEmpty {
            var data: JSONObject = [:]
            for (k, v) in push.data { data[k] = render(v.stringValue ?? "", AutomationLimits.maxDataValueBytes) }
            body["extendedParams"] = .object(data)
        }
        let request = HTTPRequest(
            method: "POST", target: "/v1/admin/push/send", headers: [], body: Array(JSON.object(body).serialized.utf8), keepAlive: true)
        do throws(APIError) {
            return .success(try pushSendRecorded(request, .operator, actor: actor))
        } catch {
            return .failure(error)
        }
    }

    /// Sends to the members of one-off segment sends (`POST .../segments/{id}/send`), at most
    /// `AutomationLimits.sendMembersPerTurn` per turn, within this second's global budget. A
    /// member without a push binding, opted out or erased is skipped with the reason.
    func runSegmentSends(_ a: AutomationState, now: Int64) throws(StoreError) {
        let budget = min(AutomationLimits.sendMembersPerTurn, a.global.available(now: now))
        guard budget > 0 else { return }
        var sends: [Int64: (Store.SendRow, AutomationRule.Push?)] = [:]
        for (sendId, euid) in try store.claimSendMembers(now: now, limit: budget) {
            if sends[sendId] == nil, let row = try store.segmentSend(sendId) {
                let c = (try? JSON.parse(row.content)) ?? .null
                var push: AutomationRule.Push?
                if let t = c["template"]?.intValue {
                    push = try sendPush(.template(t))
                } else if let p = c["push"] {
                    push = try? AutomationRule.push(p, at: "push")
                }
                sends[sendId] = (row, push)
            }
            guard let (row, push) = sends[sendId] else { continue }
            func end(_ state: String, _ reason: String?, _ msgId: String? = nil) throws(StoreError) {
                try store.finishSendMember(send: sendId, euid: euid, state: state, reason: reason, msgId: msgId)
            }
            guard let push else {
                try end("suppressed", "template_missing")
                continue
            }
            guard let userId = try store.automationUserId(appKey: row.appKey, euid: euid) else {
                try end("suppressed", "no_binding")
                continue
            }
            if try store.userConsentDenied(appKey: row.appKey, euid: euid, installId: "", userId: userId) {
                try end("suppressed", "consent")
                continue
            }
            a.global.spend(1, now: now)
            let answer = try sendRendered(
                push, appKey: row.appKey, euid: euid, userId: userId, event: .object([:]),
                msgKey: "automation-send:" + String(sendId) + ":" + euid, actor: "automation send " + String(sendId))
            switch answer {
            case .success(let r):
                if let msgId = r.body["msgId"]?.stringValue {
                    try end("sent", nil, msgId)
                } else {
                    try end("suppressed", "send_failed")
                }
            case .failure(let e) where e.status == 404:
                try end("suppressed", "no_binding")
            case .failure(let e) where e.status >= 500:
                try end("pending", nil)
            case .failure:
                try end("suppressed", "send_failed")
            }
        }
    }
}
