/* A downstream program: checks that the header it compiled against matches the library it loaded. */
#include <stdio.h>

#include <flashattn.h>

int main(void) {
    flashattn_fwd_params p;
    if (flashattn_version() != FLASHATTN_VERSION) {
        fprintf(stderr, "header %d, library %d\n", FLASHATTN_VERSION, flashattn_version());
        return 1;
    }
    if (flashattn_fwd_params_init(&p) != FLASHATTN_STATUS_SUCCESS) return 2;
    printf("consumer linked libflashattn %s\n", flashattn_version_string());
    return 0;
}
