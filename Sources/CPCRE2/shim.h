#ifndef PYLON_CPCRE2_SHIM_H
#define PYLON_CPCRE2_SHIM_H
/* PCRE2's API names are width-suffixed macros (pcre2_compile -> pcre2_compile_8), which Swift
   does not import: typed shims for the 8-bit library, the only one Pylon uses. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

typedef pcre2_code_8 pylon_pcre2_code;
typedef pcre2_match_data_8 pylon_pcre2_match_data;
typedef pcre2_match_context_8 pylon_pcre2_match_context;

static inline pcre2_code_8 *pylon_pcre2_compile(const char *pattern, size_t length, uint32_t options,
                                                int *errorcode, size_t *erroroffset) {
    return pcre2_compile_8((PCRE2_SPTR8)pattern, length, options, errorcode, erroroffset, NULL);
}
static inline int pylon_pcre2_jit_compile(pcre2_code_8 *code) {
    return pcre2_jit_compile_8(code, PCRE2_JIT_COMPLETE);
}
static inline void pylon_pcre2_code_free(pcre2_code_8 *code) { pcre2_code_free_8(code); }
static inline pcre2_match_data_8 *pylon_pcre2_match_data_create(pcre2_code_8 *code) {
    return pcre2_match_data_create_from_pattern_8(code, NULL);
}
static inline void pylon_pcre2_match_data_free(pcre2_match_data_8 *md) { pcre2_match_data_free_8(md); }
static inline pcre2_match_context_8 *pylon_pcre2_match_context_create(uint32_t match_limit, uint32_t depth_limit) {
    pcre2_match_context_8 *c = pcre2_match_context_create_8(NULL);
    if (c) {
        pcre2_set_match_limit_8(c, match_limit);
        pcre2_set_depth_limit_8(c, depth_limit);
    }
    return c;
}
static inline void pylon_pcre2_match_context_free(pcre2_match_context_8 *c) { pcre2_match_context_free_8(c); }
/* Returns the match count (> 0), PCRE2_ERROR_NOMATCH, or another negative error
   (PCRE2_ERROR_MATCHLIMIT, PCRE2_ERROR_DEPTHLIMIT, ...). */
static inline int pylon_pcre2_match(pcre2_code_8 *code, const char *subject, size_t length,
                                    pcre2_match_data_8 *md, pcre2_match_context_8 *ctx) {
    return pcre2_match_8(code, (PCRE2_SPTR8)subject, length, 0, 0, md, ctx);
}
static inline size_t *pylon_pcre2_ovector(pcre2_match_data_8 *md) { return pcre2_get_ovector_pointer_8(md); }
static inline size_t pylon_pcre2_unset(void) { return PCRE2_UNSET; }
static inline int pylon_pcre2_error_message(int code, char *buf, size_t len) {
    return pcre2_get_error_message_8(code, (PCRE2_UCHAR8 *)buf, len);
}
#endif
