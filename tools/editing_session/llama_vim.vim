" Drives llama.vim in Vim against a server: types into the file being edited, accepts the
" suggestion with <Tab>, writes the buffer to $OUT and quits. Run by llama_vim.sh.
set nocompatible
set nomore
let g:llama_config = {
    \ 'endpoint_fim': $PLD_URL . '/infill',
    \ 'show_info': 0,
    \ 'ring_n_chunks': 0,
    \ 'n_predict': 32,
    \ 't_max_predict_ms': 5000,
    \ }
execute 'set runtimepath^=' . $LLAMA_VIM
filetype plugin on
runtime plugin/llama.vim

function! Type(t)
    call feedkeys($TYPE_KEYS, 'nt')
endfunction

function! Accept(t)
    " Mapped by llama.vim while a suggestion is shown.
    call feedkeys("\<Tab>", 'mt')
endfunction

function! Save(t)
    call feedkeys("\<Esc>:w! " . $OUT . "\<CR>:qa!\<CR>", 'nt')
endfunction

call timer_start(1500, 'Type')
call timer_start(str2nr($ACCEPT_MS), 'Accept')
call timer_start(str2nr($ACCEPT_MS) + 2000, 'Save')
