import PylonPluginKit

/// The data collection switch (docs/MA.md, "Data collection (consent)") and what is collected: `ma.setDataCollectionEnabled`,
/// `ma.isDataCollectionEnabled`, `ma.setCollectControl`, `ma.setUtmProperties`. The switch is
/// the host's `ma:<appKey>` consent switch (the app's layer of it).
extension MAService {
    func setDataCollectionEnabled(_ call: Call) {
        guard let inst = usable(call) else { return }
        guard let enabled = call.params["enabled"]?.boolValue else {
            call.reply(Self.result(MACode.invalidParams, "enabled (true or false) is required"))
            return
        }
        // Behind a start waiting for the network: answered pending now, applied in order later.
        if inst.networkWait != nil { call.fail(pendingAnswer(inst)) }
        inst.whenReady { [unowned self] in
            if inst.collectionEnabled == enabled {
                call.reply(Self.result(0, "unchanged"))
                return
            }
            self.applyCollection(inst, enabled: enabled) { err in
                call.reply(err.map { Self.result(MACode.failed, $0) } ?? Self.result(0, ""))
            }
        }
    }

    func isDataCollectionEnabled(_ call: Call) {
        guard let inst = instance(for: call), inst.started else {
            call.reply(Self.result(0, "", ["enabled": .null]))
            return
        }
        guard mayUse(inst, call) else {
            call.reply(Self.notYours(inst.appKey))
            return
        }
        call.reply(Self.result(0, "", ["enabled": inst.collectionEnabled.map { .bool($0) } ?? .null]))
    }

    /// All or nothing: every field is checked before any is applied.
    func setCollectControl(_ call: Call) {
        guard let inst = usable(call) else { return }
        var changes: [String: Bool] = [:]
        for k in ["idfa", "idfv", "carrier"] {
            guard let v = call.params[k] else { continue }
            guard let b = v.boolValue else {
                call.reply(Self.result(MACode.invalidParams, "\(k) must be true or false"))
                return
            }
            changes[k] = b
        }
        for (k, b) in changes { inst.collectControl[k] = b }
        persist(inst)
        call.reply(Self.result(0, ""))
    }

    /// The keys `ma.setUtmProperties` accepts.
    static let utmKeys: Set<String> = ["utm_source", "utm_medium", "utm_term", "utm_content", "utm_campaign", "utm_id"]

    func setUtmProperties(_ call: Call) {
        guard let inst = usable(call) else { return }
        guard let props = call.params["properties"]?.objectValue else {
            call.reply(Self.result(MACode.invalidParams, "properties must be an object"))
            return
        }
        var utm: [String: String] = [:]
        for (k, v) in props {
            guard Self.utmKeys.contains(k) else {
                call.reply(Self.result(MACode.invalidParams, "unknown UTM key \(k)"))
                return
            }
            guard let s = v.stringValue, s.utf8.count <= EventValidation.maxStringBytes else {
                call.reply(Self.result(MACode.invalidParams, "\(k) must be a string of at most \(EventValidation.maxStringBytes) bytes"))
                return
            }
            utm[k] = s
        }
        // UTM is collection data: not kept while collection is disabled, by the app or by the
        // host's switch (the operator's decision, or `device`).
        if inst.collectionEnabled != false, plugin.isConsentGranted(inst.consentKey) {
            inst.utm = utm
            persist(inst)
        }
        call.reply(Self.result(0, ""))
    }

    // MARK: The switch

    /// Clears, for good, the UTM of every AppKey whose host switch (`ma:<appKey>`, or `device`)
    /// is denied, as disabling collection does: called when a switch is denied and at start.
    func clearUtmWhereDenied() {
        for inst in instances.values where !inst.utm.isEmpty && !plugin.isConsentGranted(inst.consentKey) {
            inst.utm = [:]
            persist(inst)
        }
    }

    /// Sets the host's switch for this AppKey (the host broadcasts `consent.changed`: the uploader
    /// sends what was queued once as a final batch, then purges it).
    /// `done` gets nil, or why the host did not take the change.
    func setConsent(_ inst: MAInstance, _ enabled: Bool, _ done: @escaping (String?) -> Void) {
        // The app's layer of the switch: the operator's decision (consent.set) still bounds it.
        plugin.call("consent.setApp", ["key": .string(inst.consentKey), "granted": .bool(enabled)]) { [unowned self] r in
            if case .failure(let e) = r {
                self.plugin.log.error("consent.setApp failed", ["appKey": inst.appKey, "error": e.message])
                done("the host did not take the collection switch: \(e.message)")
            } else {
                done(nil)
            }
        }
    }

    /// Turns the AppKey's collection on or off. Off waits until every event recorded before it is
    /// durable in the uploader (or answered with a failure): an event answered 0 is never dropped
    /// by the switch that follows it, and the uploader then sends it once as the final batch.
    func applyCollection(_ inst: MAInstance, enabled: Bool, _ done: @escaping (String?) -> Void) {
        let before = inst.collectionEnabled
        inst.collectionEnabled = enabled
        if !enabled {
            inst.utm = [:]  // cleared for good: not restored on re-enable
        }
        persist(inst)
        guard before != enabled || plugin.isConsentGranted(inst.consentKey) != enabled else {
            done(nil)
            return
        }
        if enabled {
            setConsent(inst, true, done)
        } else {
            whenEventsSettled(inst) { [unowned self] in self.setConsent(inst, false, done) }
        }
    }
}
