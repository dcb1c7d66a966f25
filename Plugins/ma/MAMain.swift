import PylonPluginKit

/// pylon-ma: the MA analytics SDK surface as a service (reference: docs/MA.md).
///
/// This file is only the registration table; the handlers are `MAService` methods, one file per
/// concern: identity (`MAService+Identity`), events (`+Events`), the data-collection switch
/// (`+Consent`), upload cadence and sessions (`+Session`), contacts, channel values and user
/// properties (`+Profile`), the operator view (`+Status`). The order below is the manifest's.
///
/// The plugin as a library: `run()` is its whole program. The `pylon-ma` executable
/// (`main/main.swift`) and the multi-call `pylon` binary (Sources/pylon) call it.
public enum MAMain {
    public static func run() -> Never {
        let plugin = Plugin(name: "ma", version: "0.1.0")
        // Calls act on the caller's AppKey: `appKey`, else the AppKey its connection last started.
        plugin.wantsCallerInfo = true
        // A call past the host's deadline still goes on (a start waiting for the network, an
        // event held for a restarting uploader): the host answers it pending, -32008.
        plugin.continuesAfterDeadline = true
        let ma = MAService(plugin: plugin)
        plugin.checkConfig = { j throws(ConfigProblems) in try MAConfig(j).warnings }

        // Identity: start and identifyAccount run strictly in call order per AppKey.
        plugin.method("start") { ma.start($0) }
        plugin.method("identifyAccount") { ma.identifyAccount($0) }
        plugin.method("euid") { ma.euid($0) }
        // Events, served from the request's bytes: while the AppKey's switch is denied the host answers
        // `{"code":0,"message":""}` itself.
        plugin.method(
            "eventRecord", consent: "ma:{appKey}", dropWhenDenied: true,
            deniedResult: MAService.result(0, ""), reads: .text
        ) { ma.eventRecord($0) }
        // The data collection switch and what is collected.
        plugin.method("setDataCollectionEnabled") { ma.setDataCollectionEnabled($0) }
        plugin.method("isDataCollectionEnabled") { ma.isDataCollectionEnabled($0) }
        plugin.method("setCollectControl") { ma.setCollectControl($0) }
        plugin.method("setUtmProperties") { ma.setUtmProperties($0) }
        // Upload cadence and sessions.
        plugin.method("setReportInterval") { ma.setReportInterval($0) }
        plugin.method("setMaxEventCacheCount") { ma.setMaxEventCacheCount($0) }
        plugin.method("setSessionTimeout") { ma.setSessionTimeout($0) }
        plugin.method("setAppState") { ma.setAppState($0) }
        // Contacts, channel values and user properties (validated here, sent to the backend).
        plugin.method("setUserContact") { ma.setUserContact($0) }
        plugin.method("setChannelValue") { ma.setChannelValue($0) }
        plugin.method("setProperty") { ma.setProperty($0) }
        plugin.method("increaseProperty") { ma.increaseProperty($0) }
        plugin.method("addProperty") { ma.addProperty($0) }
        plugin.method("removeProperty") { ma.removeProperty($0) }
        plugin.method("deleteProperty") { ma.deleteProperty($0) }
        plugin.method("updateObjectArrayProperty") { ma.updateObjectArrayProperty($0) }
        plugin.method("addObjectArrayProperty") { ma.addObjectArrayProperty($0) }
        plugin.method("removeObjectArrayProperty") { ma.removeObjectArrayProperty($0) }
        // Operator view (not an SDK method).
        plugin.method("status") { ma.status($0) }
        // Admins only: hand an AppKey to another uid, or release it (docs/MA.md, "AppKey owners").
        plugin.method("setOwner") { ma.setOwner($0) }
        MAMethodDocs.declare(plugin)

        plugin.subscribe("bus.client.closed") { _, p in if let c = p["client"]?.intValue { ma.clientClosed(c) } }
        plugin.onReady = { ma.ready() }
        plugin.onConsentChanged = { _, granted in if !granted { ma.clearUtmWhereDenied() } }
        plugin.onShutdown = { ma.http.shutdown() }
        plugin.run()
    }
}
