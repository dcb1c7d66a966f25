import PylonCore

/// The audit log entries of the data API's changes (erasures, sends and scheduled sends,
/// settings, retention). The audit log itself arrives with the console's operator accounts;
/// until then a change is logged only.
extension Backend {
    /// Records a change (logged).
    func recordChange(_ principal: Principal, _ action: String, target: String, detail: JSONObject = [:]) {
        log.info("change", ["actor": actorName(principal), "action": action, "target": target])
    }

    /// The name the push history and erasure records give the caller.
    func actorName(_ principal: Principal) -> String {
        if case .device(let id, _) = principal { return "device:" + id }
        return "operator"
    }
}
