import CJSONC
import PylonPluginKit

extension MAService {
    /// `appKey` of a params object (borrowed json-c tree) when it is a string, as written: for
    /// `EventParams`' json-c reader only, and goes with it (the plugin's calls read `Call.params`).
    static func appKeyParam(_ params: OpaquePointer?) -> String? {
        var v: OpaquePointer?
        guard json_object_object_get_ex(params, "appKey", &v) != 0, json_object_get_type(v) == json_type_string else { return nil }
        return String(
            decoding: UnsafeRawBufferPointer(start: json_object_get_string(v), count: Int(json_object_get_string_len(v))), as: UTF8.self)
    }
}
